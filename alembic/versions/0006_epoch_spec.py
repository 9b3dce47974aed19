"""epoch spec: how each epoch was staged (schema, options without secrets)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The EpochSpec's JSON ({"v", "options", "schema"}) persisted with the committable in
    # phase 1 and handed back to a sink's commit/abort (Capabilities.epoch_spec). NULL for the
    # epochs persisted before this revision: the sink then gets spec=None.
    with op.batch_alter_table("pending_sink_state") as t:
        t.add_column(sa.Column("spec", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pending_sink_state") as t:
        t.drop_column("spec")
