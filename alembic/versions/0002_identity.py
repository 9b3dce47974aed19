"""sink identity: bound target, GC floor, origin of each epoch

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eosink_sink") as t:
        t.add_column(sa.Column("target", sa.String(1024), nullable=True))
        # Every epoch <= gc_floor without a row was committed and garbage-collected.
        t.add_column(sa.Column("gc_floor", sa.BigInteger, nullable=False, server_default="-1"))
    with op.batch_alter_table("pending_sink_state") as t:
        # "batch" or the streaming lineage that wrote the epoch (None: written before 0002).
        t.add_column(sa.Column("origin", sa.String(64), nullable=True))
    # Before 0002 the high-water mark played the GC floor's role.
    op.execute("UPDATE eosink_sink SET gc_floor = high_water")


def downgrade() -> None:
    with op.batch_alter_table("pending_sink_state") as t:
        t.drop_column("origin")
    with op.batch_alter_table("eosink_sink") as t:
        t.drop_column("gc_floor")
        t.drop_column("target")
