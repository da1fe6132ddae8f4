"""README.md's generated tables: the API matrix (every API key and version range canopy
offers, from broker/handlers' HANDLERS, beside the clients tested against each) and the
topic config table (from broker/topic_configs.py). `python -m tests.readme_tables` prints
both; tests/unit/test_readme_tables.py fails when README.md differs, so neither can drift.
"""
from __future__ import annotations

from broker import topic_configs as tc
from broker.handlers import HANDLERS
from protocol.messages import api

ALL = "kcat, kafka-python, confluent-kafka, Java, aiokafka, kafkajs, sarama"
GROUPS = "kcat, kafka-python, confluent-kafka, Java, aiokafka, kafkajs, sarama"

# API key -> the clients whose end-to-end tests exercise it (tests/e2e, tests/cluster).
# "raw" is tests/e2e/rawclient.py, byte-level tests of the API itself.
CLIENTS_TESTED: dict[int, str] = {
    0: ALL + ", raw",
    1: ALL + ", raw",
    2: ALL + ", kafka-go, raw",
    3: ALL + ", kafka-go, raw",
    8: GROUPS + ", raw",
    9: GROUPS + ", raw",
    10: GROUPS,
    11: GROUPS,
    12: GROUPS,
    13: GROUPS,
    14: GROUPS,
    15: "kafka-python, confluent-kafka",
    16: "kafka-python, confluent-kafka",
    17: "kcat, kafka-python, confluent-kafka, Java, raw",
    18: ALL + ", kafka-go",
    19: "kafka-python, confluent-kafka, Java, kafkajs, sarama, kafka-go, raw",
    20: "kafka-python, confluent-kafka, kafkajs, sarama, kafka-go",
    21: "kafka-python, Java, raw",
    22: "kafka-python, confluent-kafka, Java, kafkajs, sarama, raw",
    23: "canopy's own followers (replication), raw",
    29: "kafka-python, confluent-kafka, Java",
    30: "kafka-python, confluent-kafka, Java",
    31: "kafka-python, confluent-kafka, Java",
    32: "kafka-python, confluent-kafka, Java, raw",
    33: "confluent-kafka, kafka-python",
    35: "kafka-python, Java, raw",
    36: "kcat, kafka-python, confluent-kafka, Java",
    37: "confluent-kafka",
    42: "kafka-python, confluent-kafka, Java",
    43: "kafka-python, confluent-kafka, Java",
    44: "kafka-python, confluent-kafka, Java, raw",
    45: "`canopy cluster promote`, raw",
    47: "kafka-python, Java, raw",
    50: "`canopy users`, raw",
    51: "`canopy users`, raw",
    60: "confluent-kafka",
    61: "kafka-python, Java, raw",
}


def api_table() -> str:
    rows = ["| API (key) | versions | clients tested against it |", "|---|---|---|"]
    for key, m in sorted(HANDLERS.items()):
        if not getattr(m, "ADVERTISED", True):
            continue
        rows.append(f"| {api(key).name} ({int(key)}) | {m.MIN_VERSION}–{m.MAX_VERSION} | {CLIENTS_TESTED[int(key)]} |")
    return "\n".join(rows)


_TYPE = {tc.BOOLEAN: "boolean", tc.STRING: "string", tc.INT: "int", tc.LONG: "long", tc.DOUBLE: "double",
         tc.LIST: "list"}


def topic_config_table() -> str:
    rows = ["| topic config | type | Kafka default | inherits from broker config | canopy acts on it |",
            "|---|---|---|---|---|"]
    for name, c in sorted(tc.TOPIC_CONFIGS.items()):
        acted = "yes" if c.acted else "no: accepted and stored"
        if c.doc:
            acted += f" ({c.doc})"
        default = c.default or '""'
        rows.append(f"| `{name}` | {_TYPE[c.type]} | `{default}` | "
                    f"{'`' + c.broker_name + '`' if c.broker_name else '—'} | {acted} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(api_table())
    print()
    print(topic_config_table())
