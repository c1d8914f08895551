"""The compose file's client: creates a topic, then produces a record and reads it back every few
seconds with confluent-kafka, printing one line per round trip (`docker compose logs client`)."""

import os
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("BOOTSTRAP_SERVERS", "kafka:29092")
TOPIC = os.environ.get("TOPIC", "demo")
ROUNDS = int(os.environ.get("ROUNDS", "0"))  # 0: for ever
INTERVAL_S = float(os.environ.get("INTERVAL_S", "5"))


def main() -> int:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    replication = int(os.environ.get("REPLICATION_FACTOR", "1"))
    deadline = time.monotonic() + 120
    while True:  # a cluster may still be starting: too few brokers registered, no controller yet
        try:
            admin.create_topics([NewTopic(TOPIC, 3, replication)])[TOPIC].result(30)
            break
        except TimeoutError:
            print("topic: no answer within 30 s", flush=True)
            retry = True
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # a restarted client
                break
            print("topic:", error, flush=True)
            retry = error.retriable() or error.code() == KafkaError.INVALID_REPLICATION_FACTOR
        if not retry or time.monotonic() > deadline:
            break
        time.sleep(1)
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "demo", "auto.offset.reset": "earliest"})
    consumer.subscribe([TOPIC])
    n = 0
    while ROUNDS == 0 or n < ROUNDS:
        n += 1
        value = b"record %d" % n
        producer.produce(TOPIC, value)
        producer.flush(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None and msg.value() == value:
                print("round trip %d ok: %s" % (n, value.decode()), flush=True)
                break
        else:
            print("round trip %d failed" % n, flush=True)
            return 1
        time.sleep(INTERVAL_S)
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
