"""Alembic's entry for the results history: the suite runs it in-process (store.connect) on the
connection it already has, so a history is created or upgraded by whoever opens it first."""

from alembic import context

connection = context.config.attributes["connection"]
# batch mode: SQLite alters a table by copying it, PostgreSQL alters in place
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
