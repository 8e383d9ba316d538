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

/** Upper-cases every value from INPUT into OUTPUT, like Sluice's `uppercase` guest. Runs until SIGTERM. */
public final class Uppercase {
    public static void main(String[] args) throws InterruptedException {
        if (args.length != 5 && args.length != 6) {
            System.err.println("usage: Uppercase BOOTSTRAP INPUT OUTPUT APPLICATION_ID THREADS [at_least_once|exactly_once_v2]");
            System.exit(2);
        }
        boolean exactlyOnce = args.length == 6 && args[5].equals(StreamsConfig.EXACTLY_ONCE_V2);
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        // Under exactly_once_v2 the commit interval is Kafka Streams' own default for it (100 ms).
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, exactlyOnce ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        if (!exactlyOnce) {
            props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        }
        props.put(StreamsConfig.producerPrefix("compression.type"), "lz4");
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[1], Consumed.with(Serdes.ByteArray(), Serdes.String()))
                .mapValues(v -> v == null ? null : v.toUpperCase(Locale.ROOT))
                .to(args[2], Produced.with(Serdes.ByteArray(), Serdes.String()));

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
