"""`servematrix bisect`: the release of one package where an environment's verdict flips, found with the
cheapest stage that tells the two ends apart (search.py: the search; releases.py: the versions; checks.py:
one release at one stage; runner.py: the bisection; command.py: the command line).

A finished bisection leaves a note in the evidence of the cells on the failing side of the change
(`report/bisectnote.py`, with the report that reads it), so the report's failure page for their class names
the release that introduced (or fixed) it. The stages it runs, the pipeline it runs them through and the
report's reading are theirs.
"""
