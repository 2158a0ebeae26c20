"""A run's identity is its content, not its folder's name: `run` holds the content key of the raw
data for rows added from now on (store.run_key), `name` the folder's name to show; rows of older
histories keep their name as their identity (the only one they had). `settings` (a digest of what
a run measured: model, server and arm settings, workload) joins the series key. `acks` records a
regression someone accepted: who, why, which change, so a nightly can go green after it.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    for table in ("runs", "gates", "comparisons"):
        with op.batch_alter_table(table) as b:
            b.add_column(sa.Column("name", sa.Text))
        op.execute(f"UPDATE {table} SET name = run")
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("settings", sa.Text))
    op.create_table(
        "acks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", sa.Text, nullable=False),  # the first run after the accepted change
        sa.Column("metric", sa.Text, nullable=False),
        sa.Column("by", sa.Text, nullable=False),
        sa.Column("why", sa.Text, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.UniqueConstraint("run", "metric"),
    )


def downgrade() -> None:
    op.drop_table("acks")
    with op.batch_alter_table("runs") as b:
        b.drop_column("settings")
    for table in ("runs", "gates", "comparisons"):
        with op.batch_alter_table(table) as b:
            b.drop_column("name")
