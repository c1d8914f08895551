"""KafkaDataSource: the format users pass to spark.read / readStream / write / writeStream."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_kafka.options import (
    OptionError,
    batch_source_options,
    sink_options,
    stream_source_options,
)
from pyspark_kafka.reader import KafkaBatchReader, KafkaStreamReader
from pyspark_kafka.writer import (
    HEADERS_SPARK_TYPE,
    KafkaBatchWriter,
    KafkaStreamWriter,
    validate_schema,
)

FORMAT = "pyspark_kafka"


def kafka_schema(include_headers: bool) -> StructType:
    """Spark's KafkaRecordToRowConverter.kafkaSchema."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_SPARK_TYPE))
    return StructType(fields)


class KafkaDataSource(DataSource):
    """Kafka topics as a Spark data source, with the contract of Spark's own Kafka connector.

    Register it once per session, then use the format name `pyspark_kafka`::

        spark.dataSource.register(KafkaDataSource)
        spark.read.format("pyspark_kafka").option("kafka.bootstrap.servers", "host:9092")
            .option("subscribe", "events").load()
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _include_headers(self) -> bool:
        return str(self.options.get("includeheaders", "false")).strip().lower() == "true"

    def schema(self) -> StructType:
        return kafka_schema(self._include_headers())

    def _check_schema(self, schema: StructType) -> None:
        if schema != self.schema():
            raise OptionError("Kafka source has a fixed schema and cannot be set with a custom one")

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return KafkaBatchReader(batch_source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return KafkaStreamReader(stream_source_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError(
                "Save mode Overwrite not allowed for Kafka. Allowed save modes are Append and "
                "ErrorIfExists (default)."
            )
        options = sink_options(self.options, streaming=False)
        validate_schema(schema, options.topic)
        return KafkaBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = sink_options(self.options, streaming=True)
        validate_schema(schema, options.topic)
        if options.exactly_once:
            from pyspark_kafka.transactional import KafkaTransactionalStreamWriter

            return KafkaTransactionalStreamWriter(options)
        return KafkaStreamWriter(options)
