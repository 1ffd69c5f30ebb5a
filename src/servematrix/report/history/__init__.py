"""Each cell's history over publishes (`record`: entries, categories, the bound, the feed
`results/history.json`), the pre-flight's track record (`track`) and how the report shows both (`page`)."""
