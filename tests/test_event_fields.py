"""One source of truth for event fields: every field of every event struct has a ledger
column and every column is a field (or one the ledger adds); the rows the sink writes
fill every column; the newest migration matches the tables (test_services:
test_migrations_match_the_models runs `alembic check`)."""

import msgspec

from streamrl.producers.synthetic import synthetic_events
from streamrl.schema.events import GroupFiltered, Sample
from streamrl.schema.ledger import ROW_COLUMNS, TABLE_BY_EVENT, event_row, field_column_mismatches, samples


def test_every_event_field_has_a_column_and_every_column_a_field():
    problems = [p for event_type, table in TABLE_BY_EVENT.items() for p in field_column_mismatches(event_type, table)]
    assert problems == []


def test_a_new_field_without_a_column_is_caught():
    class SampleWithMore(Sample, tag="sample_with_more"):
        new_field: int = 0

    assert field_column_mismatches(SampleWithMore, samples) == ["SampleWithMore.new_field: no column in table samples"]


def test_the_sinks_rows_fill_every_column_of_every_table():
    seen = set()
    filtered = GroupFiltered(run_id="fields", group_id="g", reason="timeout", rewards=[0.0], trajectory_ids=["t"])
    for event in [*synthetic_events("fields", 2), filtered]:
        table = TABLE_BY_EVENT[type(event)]
        row = event_row(event, "t", 0, 0)
        wanted = {c.name for c in table.columns} - {"id", "ingested_at"}
        assert wanted <= set(row), (type(event).__name__, sorted(wanted - set(row)))
        assert set(row) <= {c.name for c in table.columns}, (type(event).__name__, sorted(set(row) - wanted))
        seen.add(type(event))
    assert seen == set(TABLE_BY_EVENT)
    assert {"kafka_topic", "kafka_partition", "kafka_offset"} <= set(ROW_COLUMNS)
    assert msgspec.structs.fields(Sample)  # structs, not dataclasses: the codec's own field list
