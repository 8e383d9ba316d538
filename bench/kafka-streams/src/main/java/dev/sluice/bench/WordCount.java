package dev.sluice.bench;

import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * Counts words per input partition like Sluice's `word-count` guest: split on anything not a
 * letter or digit, lower-case, get + put in a persistent (RocksDB, changelogged) store, emit
 * `word -> count` on every update. No repartitioning, as in the guest. Runs until SIGTERM.
 */
public final class WordCount {
    static final class Counter implements Processor<byte[], String, String, String> {
        private ProcessorContext<String, String> context;
        private KeyValueStore<String, Long> counts;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.counts = context.getStateStore("counts");
        }

        @Override
        public void process(Record<byte[], String> record) {
            if (record.value() == null) {
                return;
            }
            for (String word : record.value().split("[^\\p{L}\\p{N}]+")) {
                if (word.isEmpty()) {
                    continue;
                }
                String w = word.toLowerCase(Locale.ROOT);
                Long old = counts.get(w);
                long count = (old == null ? 0 : old) + 1;
                counts.put(w, count);
                context.forward(new Record<>(w, Long.toString(count), record.timestamp()));
            }
        }
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length != 5) {
            System.err.println("usage: WordCount BOOTSTRAP INPUT OUTPUT APPLICATION_ID THREADS");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/kstreams-" + args[3]);
        props.put(StreamsConfig.producerPrefix("compression.type"), "lz4");
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore("counts"), Serdes.String(), Serdes.Long())
                // Like a Sluice store: writes reach the changelog once per key per commit.
                .withCachingEnabled());
        builder.stream(args[1], Consumed.with(Serdes.ByteArray(), Serdes.String()))
                .process(Counter::new, "counts")
                .to(args[2], Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.start();
        done.await();
    }
}
