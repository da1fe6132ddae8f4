"""README.md's API matrix and topic config table are generated (tests/readme_tables.py);
they must match what the code offers."""
from pathlib import Path

from broker.handlers import HANDLERS
from tests.readme_tables import CLIENTS_TESTED, api_table, topic_config_table

README = Path(__file__).resolve().parents[2] / "README.md"


def _between(text: str, marker: str) -> str:
    start = text.index(f"<!-- {marker}:begin -->\n") + len(f"<!-- {marker}:begin -->\n")
    return text[start:text.index(f"\n<!-- {marker}:end -->")]


def test_every_offered_api_names_its_tested_clients():
    assert set(CLIENTS_TESTED) == {int(k) for k in HANDLERS}


def test_readme_api_table_matches_the_handlers():
    assert _between(README.read_text(), "api-table") == api_table(), \
        "README.md's API table is stale: paste the output of `python -m tests.readme_tables`"


def test_readme_topic_config_table_matches_the_schema():
    assert _between(README.read_text(), "topic-configs") == topic_config_table(), \
        "README.md's topic config table is stale: paste the output of `python -m tests.readme_tables`"
