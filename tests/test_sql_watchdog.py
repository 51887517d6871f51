"""A read-only query cannot lift its own time limit: its first batch may set
`statement_timeout` to 0 for the rest of its transaction (what the SQL box's readers can
do), and the session is still cancelled from outside once the limit has passed. Against
the machine's PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL, as CI sets it)."""

from __future__ import annotations

import os
import time

import pytest

from streamrl.runtime.sql import SqlFailed, run_readonly

URL = os.environ.get("STREAMRL_TEST_EXTERNAL_DATABASE_URL")

# rows 1..1000 (the first fetch) are instant and lift the timeout; the next fetch sleeps 5 s
LIFTS_ITS_OWN_LIMIT = """
select g, case when g = 1 then set_config('statement_timeout', '0', true)
               when g > 1000 then pg_sleep(0.005)::text end
from generate_series(1, 2000) g
"""


@pytest.mark.skipif(not URL, reason="needs an external PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL)")
def test_a_query_that_lifts_its_statement_timeout_is_still_cancelled_at_the_limit():
    started = time.monotonic()
    with pytest.raises(SqlFailed, match=r"statement timed out after 1 s"):
        run_readonly(URL, LIFTS_ITS_OWN_LIMIT, timeout_s=1.0)
    assert time.monotonic() - started < 4.0  # cancelled near the limit, not after the 5 s of sleep
    assert len(run_readonly(URL, "select 1", timeout_s=1.0).rows) == 1  # a fresh session is not affected
