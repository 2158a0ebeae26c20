"""The history as the suite kept it before Alembic (its schema version 2): one row per run-level
measurement, its metrics, the run's gate outcomes and A/B figures. A history from before Alembic
(no version table) comes through here too: its missing tables are created and its `runs` gets
the columns later suites added, empty for its old rows.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

RUNS_ADDED = {  # columns added to runs before Alembic (schema 2), by name
    "scenario_sha": sa.Text,
    "workload": sa.Text,
    "gpu_count": sa.Integer,
    "tp": sa.Integer,
    "calibration": sa.Integer,
    "build_url": sa.Text,
}


def upgrade() -> None:
    have = set(sa.inspect(op.get_bind()).get_table_names())
    if "runs" not in have:
        op.create_table(
            "runs",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("run", sa.Text, nullable=False),
            sa.Column("arm", sa.Text, nullable=False),
            sa.Column("repeat", sa.Integer, nullable=False),
            sa.Column("server_start", sa.Integer, nullable=False),
            sa.Column("scenario", sa.Text, nullable=False),
            *(sa.Column(n, sa.Text) for n in ("label", "backend", "model", "vllm", "flashinfer", "torch", "gpu")),
            sa.Column("driver", sa.Text),
            sa.Column("suite_commit", sa.Text),
            sa.Column("started", sa.Text, nullable=False),
            sa.Column("status", sa.Text),
            sa.Column("exit_code", sa.Integer),
            *(sa.Column(n, t) for n, t in RUNS_ADDED.items()),
            sa.UniqueConstraint("run", "arm", "repeat"),
        )
        op.create_index("runs_by_series", "runs", ["scenario", "arm", "backend", "started"])
    else:
        cols = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("runs")}
        with op.batch_alter_table("runs") as b:
            for name, type_ in RUNS_ADDED.items():
                if name not in cols:
                    b.add_column(sa.Column(name, type_))
    if "metrics" not in have:
        op.create_table(
            "metrics",
            sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), primary_key=True),
            sa.Column("key", sa.Text, primary_key=True),
            sa.Column("value", sa.Float, nullable=False),
        )
    if "gates" not in have:
        op.create_table(
            "gates",
            sa.Column("run", sa.Text, primary_key=True),
            sa.Column("gate", sa.Text, primary_key=True),
            sa.Column("metric", sa.Text),
            sa.Column("outcome", sa.Text, nullable=False),
            sa.Column("detail", sa.Text),
            sa.Column("started", sa.Text),
            sa.Column("scenario", sa.Text),
        )
    if "comparisons" not in have:
        op.create_table(
            "comparisons",
            sa.Column("run", sa.Text, primary_key=True),
            sa.Column("metric", sa.Text, primary_key=True),
            *(sa.Column(n, sa.Float) for n in ("baseline", "candidate", "rel_change", "ci_low", "ci_high")),
            sa.Column("verdict", sa.Text),
            sa.Column("started", sa.Text),
            sa.Column("scenario", sa.Text),
        )


def downgrade() -> None:
    for t in ("comparisons", "gates", "metrics", "runs"):
        op.drop_table(t)
