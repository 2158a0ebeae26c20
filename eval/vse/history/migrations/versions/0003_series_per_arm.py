"""An arm's series is keyed by its own settings (store.settings_digest(s, arm)), not by the pair it
ran in: the digests revision 0002 stored covered both arms, so one CUTLASS baseline was two series
when paired with torch and with FlashInfer. They cannot be recomputed from what the rows kept, so
they are cleared: a row without settings joins the one series that matches it on every other
column (store.series_keys), and an older night stays in its series across the upgrade.

Revision ID: 0003
"""

from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.execute("UPDATE runs SET settings = NULL")


def downgrade() -> None:
    pass  # the pair digests are gone; rows without settings read the same under 0002
