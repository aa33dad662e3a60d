"""One screen per module: main, create form, confirmation, verify progress, not running."""
