import sys

from servematrix.cli import main

sys.exit(main())
