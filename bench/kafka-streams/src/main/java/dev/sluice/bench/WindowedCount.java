package dev.sluice.bench;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * A windowed count in Kafka Streams' DSL, as its users write it: events keyed by user,
 * groupByKey, tumbling windows of one minute with 10 s of grace, count into a persistent
 * window store, and every update downstream as `user@<window start ms>` → count (text). The
 * same job as Sluice's `dsl-windowed-count` guest. The DSL's record cache stays at its
 * default (10 MB): an update of a window is forwarded at most once per commit. Runs until
 * SIGTERM.
 */
public final class WindowedCount {
    public static void main(String[] args) throws InterruptedException {
        if (args.length != 5) {
            System.err.println("usage: WindowedCount BOOTSTRAP INPUT OUTPUT APPLICATION_ID THREADS");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        Path stateDir = StateDir.of(args[3]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put(StreamsConfig.producerPrefix("compression.type"), "lz4");
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[1], Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofSeconds(10)))
                .count(Materialized.as("counts"))
                .toStream()
                .map((window, count) -> KeyValue.pair(
                        window.key() + "@" + window.window().start(), Long.toString(count)))
                .to(args[2], Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            StateDir.remove(stateDir); // one per run: nothing of it is read again
            done.countDown();
        }));
        streams.start();
        done.await();
    }
}
