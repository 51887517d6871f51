"""training service: API keys, sessions, models, requests and checkpoints of
`streamrl serve-training`

Revision ID: 0010
Revises: 0009
"""

from alembic import op

from streamrl.schema.service import service_metadata

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    service_metadata.create_all(bind=op.get_bind())


def downgrade() -> None:
    service_metadata.drop_all(bind=op.get_bind())
