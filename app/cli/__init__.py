"""`memchat` command line: serve, migrate, reindex, chat. The entry point is
`app.cli.main:main`; this package's `__init__` imports none of its modules, so that none
of them, importing another, runs into a half-imported package."""
