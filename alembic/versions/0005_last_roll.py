"""last roll: what a rolling sink published between epochs, for `eosink status`

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A roll between epochs (by time, or everything at the end of a run) changes the target
    # only; `eosink status` reads this JSON ({"at", "files", "everything"}) to tell which of
    # the open files its last committable lists are still open. Informational, best effort.
    with op.batch_alter_table("eosink_sink") as t:
        t.add_column(sa.Column("last_roll", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eosink_sink") as t:
        t.drop_column("last_roll")
