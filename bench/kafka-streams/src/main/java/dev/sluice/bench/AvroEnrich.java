package dev.sluice.bench;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Avro pipeline of Sluice's `guests/avro-enrich`, in Kafka Streams with Avro's Java library:
 * orders in the Confluent wire format read with their writer schema from the registry (by the
 * id in each record, fetched once and cached) resolved against the reader schema (one
 * GenericDatumReader per writer id, which resolves the pair once, as Confluent's
 * KafkaAvroDeserializer does), enriched with their total, orders of quantity 0 dropped, and
 * written as Avro under the output topic's subject, registered once. Prints `RUNNING` to stdout
 * once running; runs until SIGTERM.
 *
 * <p>With {@code --micro RECORDS}, it times decoding and encoding alone instead (JIT warmed).
 */
public final class AvroEnrich {
    public static void main(String[] args) throws Exception {
        if (args.length >= 1 && args[0].equals("--micro")) {
            micro(args);
            return;
        }
        if (args.length != 8 && args.length != 9) {
            System.err.println("usage: AvroEnrich BOOTSTRAP INPUT OUTPUT APPLICATION_ID THREADS REGISTRY_URL READER.avsc OUTPUT.avsc [at_least_once|exactly_once_v2]");
            System.exit(2);
        }
        boolean exactlyOnce = args.length == 9 && args[8].equals(StreamsConfig.EXACTLY_ONCE_V2);
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, exactlyOnce ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        if (!exactlyOnce) {
            props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        }
        props.put(StreamsConfig.producerPrefix("compression.type"), "lz4");
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        Registry registry = new Registry(args[5]);
        Schema reader = new Schema.Parser().parse(Files.readString(Path.of(args[6])));
        Schema enriched = new Schema.Parser().parse(Files.readString(Path.of(args[7])));
        Serde<GenericRecord> in = Serdes.serdeFrom(new FramedSerializer(registry, enriched, args[2] + "-value"), new FramedDeserializer(registry, reader));
        Serde<GenericRecord> out = Serdes.serdeFrom(new FramedSerializer(registry, enriched, args[2] + "-value"), new FramedDeserializer(registry, enriched));

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[1], Consumed.with(Serdes.ByteArray(), in))
                .filter((k, order) -> order != null && (Integer) order.get("quantity") != 0)
                .mapValues(order -> enrich(order, enriched))
                .to(args[2], Produced.with(Serdes.ByteArray(), out));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        AtomicBoolean announced = new AtomicBoolean();
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING && announced.compareAndSet(false, true)) {
                System.out.println("RUNNING");
                System.out.flush();
            }
        });
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.start();
        done.await();
    }

    /** An order's enrichment, as `guests/avro-enrich` makes it. */
    static GenericRecord enrich(GenericRecord order, Schema enriched) {
        double total = (Double) order.get("amount") * (Integer) order.get("quantity");
        GenericRecord e = new GenericData.Record(enriched);
        e.put("id", order.get("id"));
        e.put("customer", order.get("customer"));
        e.put("total", total);
        e.put("large", total >= 100.0);
        e.put("channel", order.get("channel"));
        e.put("placed", order.get("placed"));
        return e;
    }

    /** The Schema Registry's REST API, as much as the serdes need: schemas by id, registering. */
    static final class Registry {
        private final String url;
        private final HttpClient http = HttpClient.newHttpClient();
        private final Map<Integer, Schema> byId = new ConcurrentHashMap<>();

        Registry(String url) {
            this.url = url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
        }

        Schema schema(int id) {
            return byId.computeIfAbsent(id, i -> {
                String body = send(HttpRequest.newBuilder(URI.create(url + "/schemas/ids/" + i)).GET());
                return new Schema.Parser().parse(jsonString(body, "schema"));
            });
        }

        int register(String subject, Schema schema) {
            String payload = "{\"schema\":" + quote(schema.toString()) + "}";
            String body = send(HttpRequest.newBuilder(URI.create(url + "/subjects/" + subject + "/versions"))
                    .header("Content-Type", "application/vnd.schemaregistry.v1+json")
                    .POST(HttpRequest.BodyPublishers.ofString(payload)));
            Matcher m = Pattern.compile("\"id\"\\s*:\\s*(\\d+)").matcher(body);
            if (!m.find()) {
                throw new IllegalStateException("the registry's answer has no id: " + body);
            }
            return Integer.parseInt(m.group(1));
        }

        private String send(HttpRequest.Builder request) {
            try {
                HttpResponse<String> response = http.send(request.build(), HttpResponse.BodyHandlers.ofString());
                if (response.statusCode() / 100 != 2) {
                    throw new IllegalStateException("the registry answered " + response.statusCode() + ": " + response.body());
                }
                return response.body();
            } catch (IOException | InterruptedException e) {
                throw new IllegalStateException("asking the registry at " + url, e);
            }
        }

        private static String quote(String s) {
            StringBuilder out = new StringBuilder("\"");
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"' -> out.append("\\\"");
                    case '\\' -> out.append("\\\\");
                    case '\n' -> out.append("\\n");
                    default -> out.append(c);
                }
            }
            return out.append('"').toString();
        }

        /** The string value of `field` in a JSON object (the registry's answers are small). */
        private static String jsonString(String json, String field) {
            int at = json.indexOf("\"" + field + "\"");
            int start = json.indexOf('"', json.indexOf(':', at) + 1) + 1;
            StringBuilder out = new StringBuilder();
            for (int i = start; i < json.length(); i++) {
                char c = json.charAt(i);
                if (c == '\\') {
                    char n = json.charAt(++i);
                    switch (n) {
                        case 'n' -> out.append('\n');
                        case 't' -> out.append('\t');
                        case 'u' -> {
                            out.append((char) Integer.parseInt(json.substring(i + 1, i + 5), 16));
                            i += 4;
                        }
                        default -> out.append(n);
                    }
                } else if (c == '"') {
                    break;
                } else {
                    out.append(c);
                }
            }
            return out.toString();
        }
    }

    /** Confluent-framed Avro in: the writer's schema by id, resolved against `reader` once per id. */
    static final class FramedDeserializer implements Deserializer<GenericRecord> {
        private final Registry registry;
        private final Schema reader;
        private final Map<Integer, GenericDatumReader<GenericRecord>> readers = new ConcurrentHashMap<>();
        private final ThreadLocal<BinaryDecoder> decoders = new ThreadLocal<>();

        FramedDeserializer(Registry registry, Schema reader) {
            this.registry = registry;
            this.reader = reader;
        }

        @Override
        public GenericRecord deserialize(String topic, byte[] data) {
            if (data == null) {
                return null;
            }
            ByteBuffer buffer = ByteBuffer.wrap(data);
            if (buffer.get() != 0) {
                throw new IllegalArgumentException("no magic byte");
            }
            int id = buffer.getInt();
            GenericDatumReader<GenericRecord> datumReader = readers.computeIfAbsent(id, i -> new GenericDatumReader<>(registry.schema(i), reader));
            BinaryDecoder decoder = DecoderFactory.get().binaryDecoder(data, 5, data.length - 5, decoders.get());
            decoders.set(decoder);
            try {
                return datumReader.read(null, decoder);
            } catch (IOException e) {
                throw new IllegalArgumentException("not Avro of schema id " + id, e);
            }
        }
    }

    /** Avro out, framed with the id `schema` has under `subject` (registered once). */
    static final class FramedSerializer implements Serializer<GenericRecord> {
        private final Schema schema;
        private final GenericDatumWriter<GenericRecord> writer;
        private final int id;
        private final ThreadLocal<BinaryEncoder> encoders = new ThreadLocal<>();

        FramedSerializer(Registry registry, Schema schema, String subject) {
            this.schema = schema;
            this.writer = new GenericDatumWriter<>(schema);
            this.id = registry.register(subject, schema);
        }

        @Override
        public byte[] serialize(String topic, GenericRecord record) {
            if (record == null) {
                return null;
            }
            ByteArrayOutputStream out = new ByteArrayOutputStream(64);
            out.write(0);
            out.write(id >>> 24);
            out.write(id >>> 16);
            out.write(id >>> 8);
            out.write(id);
            BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(out, encoders.get());
            encoders.set(encoder);
            try {
                writer.write(record, encoder);
                encoder.flush();
            } catch (IOException e) {
                throw new IllegalArgumentException("writing a record of " + schema.getFullName(), e);
            }
            return out.toByteArray();
        }
    }

    /**
     * Times decoding and encoding alone: `--micro RECORDS REGISTRY_URL READER.avsc OUTPUT.avsc
     * FRAMED_FILE` decodes each framed record of FRAMED_FILE (length-prefixed), enriches it and
     * encodes the result, RECORDS times in all, after as many again to warm the JIT; prints ns
     * per record for each step.
     */
    static void micro(String[] args) throws Exception {
        int records = Integer.parseInt(args[1]);
        Registry registry = new Registry(args[2]);
        Schema reader = new Schema.Parser().parse(Files.readString(Path.of(args[3])));
        Schema enriched = new Schema.Parser().parse(Files.readString(Path.of(args[4])));
        byte[] all = Files.readAllBytes(Path.of(args[5]));
        java.util.List<byte[]> framed = new java.util.ArrayList<>();
        ByteBuffer b = ByteBuffer.wrap(all);
        while (b.remaining() >= 4) {
            byte[] r = new byte[b.getInt()];
            b.get(r);
            framed.add(r);
        }
        FramedDeserializer de = new FramedDeserializer(registry, reader);
        FramedSerializer ser = new FramedSerializer(registry, enriched, "bench-micro-" + System.nanoTime() + "-value");
        GenericRecord[] decoded = new GenericRecord[framed.size()];
        long sink = 0;
        for (int pass = 0; pass < 2; pass++) {
            long decodeNs = 0, encodeNs = 0;
            for (int i = 0; i < records; i++) {
                byte[] r = framed.get(i % framed.size());
                long t0 = System.nanoTime();
                GenericRecord order = de.deserialize("in", r);
                long t1 = System.nanoTime();
                GenericRecord e = enrich(order, enriched);
                long t2 = System.nanoTime();
                byte[] out = ser.serialize("out", e);
                long t3 = System.nanoTime();
                decodeNs += t1 - t0;
                encodeNs += t3 - t2;
                sink += out.length;
                decoded[i % decoded.length] = order;
            }
            if (pass == 1) {
                System.out.printf("java avro: %.0f ns to decode (resolving), %.0f ns to encode, per record (%d records, %d bytes out)%n",
                        (double) decodeNs / records, (double) encodeNs / records, records, sink);
            }
        }
    }
}
