package dev.sluice.bench;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
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
import org.apache.kafka.streams.kstream.Repartitioned;

/**
 * The true word count in Kafka Streams' DSL, as its users write it: flatMap each line to
 * (word, "") (a key change), repartition by word, groupByKey, count into a persistent store,
 * and send every count downstream. The same split as Sluice's `word-totals` guest (anything
 * not a letter or digit, lower-cased). With REPARTITION_PARTITIONS 0 the repartition topic
 * takes the input's partition count (plain groupByKey); otherwise that many, as
 * `word-totals` declares 8. The DSL's record cache stays at its default (10 MB): an update
 * of a word is forwarded at most once per commit. Runs until SIGTERM.
 */
public final class WordTotals {
    public static void main(String[] args) throws InterruptedException {
        if (args.length != 6) {
            System.err.println("usage: WordTotals BOOTSTRAP INPUT OUTPUT APPLICATION_ID THREADS REPARTITION_PARTITIONS");
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
        int repartitions = Integer.parseInt(args[5]);

        StreamsBuilder builder = new StreamsBuilder();
        var words = builder.stream(args[1], Consumed.with(Serdes.ByteArray(), Serdes.String()))
                .flatMap((key, line) -> {
                    List<KeyValue<String, String>> out = new ArrayList<>();
                    if (line == null) {
                        return out;
                    }
                    for (String word : line.split("[^\\p{L}\\p{N}]+")) {
                        if (!word.isEmpty()) {
                            out.add(KeyValue.pair(word.toLowerCase(Locale.ROOT), ""));
                        }
                    }
                    return out;
                });
        var grouped = repartitions > 0
                ? words.repartition(Repartitioned.<String, String>as("words")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.String())
                        .withNumberOfPartitions(repartitions))
                        .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                : words.groupByKey(Grouped.<String, String>as("words")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()));
        grouped.count(Materialized.as("counts"))
                .toStream()
                .mapValues(count -> Long.toString(count))
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
