// Produces one record per line of stdin (`<hex key>` or `<hex key> <hex value>`; an empty
// key is the empty key; without a value the value is the key) with Kafka's own Java
// producer and its default partitioner, and prints `<hex key> <partition>` for each, in
// order, as the broker acknowledged it. The tests compare the
// partitions Sluice's outputs land in with these.
//
//     java -cp "$(dev/kafka classpath)" tests/java/ProduceKeys.java BOOTSTRAP TOPIC [name=value...]
//
// Extra arguments are producer properties (a secured cluster's SASL settings).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ProduceKeys {
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: ProduceKeys BOOTSTRAP TOPIC [name=value...]");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("acks", "all");
        props.put("linger.ms", "5");
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq < 1) {
                System.err.println("not a property (name=value): " + args[i]);
                System.exit(2);
            }
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        HexFormat hex = HexFormat.of();
        List<String> keys = new ArrayList<>();
        List<String> values = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] fields = line.trim().split(" ", -1);
            keys.add(fields[0]);
            values.add(fields.length > 1 ? fields[1] : fields[0]);
        }
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < keys.size(); i++) {
                byte[] key = hex.parseHex(keys.get(i));
                byte[] value = hex.parseHex(values.get(i));
                sent.add(producer.send(new ProducerRecord<>(args[1], key, value)));
            }
            producer.flush();
            StringBuilder out = new StringBuilder();
            for (int i = 0; i < keys.size(); i++) {
                out.append(keys.get(i)).append(' ').append(sent.get(i).get().partition()).append('\n');
            }
            System.out.print(out);
        }
    }
}
