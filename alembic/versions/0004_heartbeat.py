"""heartbeat: when each sink's coordinator last said it runs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Written by the running coordinator every 30 s and cleared when it stops cleanly:
    # `eosink status` and the operator commands tell a live owner on another host from a
    # dead one by it.
    with op.batch_alter_table("eosink_sink") as t:
        t.add_column(sa.Column("heartbeat_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eosink_sink") as t:
        t.drop_column("heartbeat_at")
