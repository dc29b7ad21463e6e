"""Reports of worlds: the JSON document, the HTML swimlane page, the Chrome trace."""
