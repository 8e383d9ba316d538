package dev.sluice.bench;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import java.util.regex.Pattern;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

import dev.sluice.bench.OrderJson.Order;

/**
 * The DSL guests of Sluice (`guests/dsl-*`), each written again in Kafka Streams' DSL, for
 * the differential test: the same topology run by Kafka Streams and by Sluice on the same
 * input, outputs compared record by record. Every serde writes the bytes of the SDK's codec
 * (`String`: UTF-8; `u64`/`i64`: 8 bytes big-endian; `None`: a null value; key `()`: not
 * read; `Json<Order>`: {@link OrderJson}) and every output is formatted as the guest formats
 * it.
 *
 * <pre>
 * java -cp CLASSPATH dev.sluice.bench.Dsl BOOTSTRAP APPLICATION_ID GUARANTEE CACHE_BYTES TOPOLOGY ROLE=TOPIC...
 * </pre>
 *
 * GUARANTEE is `at-least-once` or `exactly-once` (v2); CACHE_BYTES is
 * `statestore.cache.max.bytes` (0: every update is forwarded); TOPOLOGY is a guest's crate
 * name; each ROLE is a name the guest gives a source, table, global table or sink, bound to a
 * topic. Prints the topology's description to stderr, `RUNNING` to stdout once running; exits
 * 1 if the application fails, 2 on a bad command line. Runs until SIGTERM, then closes and
 * removes its state directory.
 */
public final class Dsl {
    private Dsl() {}

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 5) {
            usage("expected BOOTSTRAP APPLICATION_ID GUARANTEE CACHE_BYTES TOPOLOGY ROLE=TOPIC...");
        }
        String bootstrap = args[0];
        String applicationId = args[1];
        String guarantee = switch (args[2]) {
            case "at-least-once" -> StreamsConfig.AT_LEAST_ONCE;
            case "exactly-once" -> StreamsConfig.EXACTLY_ONCE_V2;
            default -> usage("GUARANTEE is at-least-once or exactly-once, not " + args[2]);
        };
        long cacheBytes;
        try {
            cacheBytes = Long.parseLong(args[3]);
        } catch (NumberFormatException e) {
            cacheBytes = usage("CACHE_BYTES is a number of bytes, not " + args[3]);
        }
        String topologyName = args[4];
        Roles roles = new Roles(topologyName);
        for (int i = 5; i < args.length; i++) {
            roles.bind(args[i]);
        }

        StreamsBuilder builder = new StreamsBuilder();
        switch (topologyName) {
            case "dsl-word-count" -> wordCount(builder, roles);
            case "dsl-page-views" -> pageViews(builder, roles);
            case "dsl-sessions" -> sessions(builder, roles);
            case "dsl-orders-payments" -> ordersPayments(builder, roles);
            case "dsl-enrich-orders" -> enrichOrders(builder, roles);
            case "dsl-revenue" -> revenue(builder, roles);
            case "dsl-windowed-count" -> windowedCount(builder, roles);
            case "dsl-activity" -> activity(builder, roles);
            default -> usage("no topology " + topologyName + "; there are dsl-word-count, dsl-page-views, "
                    + "dsl-sessions, dsl-orders-payments, dsl-enrich-orders, dsl-revenue, dsl-windowed-count, "
                    + "dsl-activity");
        }
        roles.check();

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, cacheBytes);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        Path stateDir = StateDir.of(applicationId);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // Kafka Streams checks for closed windows and for join records past their window at
        // most once a second of wall-clock time, and only when a record comes: with the whole
        // input read in less than a second, the last windows would wait for a record that
        // never comes. Checked at every record instead, as Sluice checks at every punctuation
        // (internal settings, the same results, only sooner).
        props.put("__emit.interval.ms.kstreams.windowed.aggregation__", 0L);
        props.put("__emit.interval.ms.kstreams.outer.join.spurious.results.fix__", 0L);

        Topology topology = builder.build(props);
        System.err.println(topology.describe());

        KafkaStreams streams = new KafkaStreams(topology, props);
        AtomicBoolean announced = new AtomicBoolean();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch failed = new CountDownLatch(1);
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING && announced.compareAndSet(false, true)) {
                System.out.println("RUNNING");
                System.out.flush();
            } else if (now == KafkaStreams.State.ERROR) {
                failed.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(10));
            StateDir.remove(stateDir); // one per run: nothing of it is read again
        }));
        streams.start();
        failed.await(); // until ERROR; SIGTERM ends the process through the hook
        Throwable e = failure.get();
        if (e != null) {
            e.printStackTrace();
        } else {
            System.err.println("Kafka Streams went to ERROR");
        }
        System.exit(1);
    }

    // ---------------------------------------------------------------------------------------
    // The topologies, one per guest.

    /** Rust's `char::is_whitespace` (Unicode White_Space), which `str::split_whitespace` splits on. */
    private static final Pattern WHITESPACE = Pattern.compile("\\p{IsWhite_Space}+");

    /**
     * Mirrors `guests/dsl-word-count`: lines (keys not read) split on whitespace into
     * lower-case words, regrouped by word through the repartition topic `words`, counted in
     * the store `counts`; every count goes to `totals` as word → count (8 bytes big-endian).
     */
    static void wordCount(StreamsBuilder b, Roles r) {
        b.stream(r.topic("lines"), Consumed.with(Serdes.ByteArray(), Serdes.String()))
                .flatMapValues(line -> {
                    // line.split_whitespace().map(str::to_lowercase): Java's toLowerCase
                    // (Locale.ROOT) is Unicode's full lower-casing as Rust's is (final sigma
                    // included); the two may know different Unicode versions.
                    List<String> words = new ArrayList<>();
                    for (String word : WHITESPACE.split(line)) {
                        if (!word.isEmpty()) {
                            words.add(word.toLowerCase(Locale.ROOT));
                        }
                    }
                    return words;
                })
                .groupBy((key, word) -> word, Grouped.<String, String>as("words")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()))
                .count(keyValueStore("counts", Serdes.String(), Serdes.Long()))
                .toStream()
                .to(r.topic("totals"), Produced.with(Serdes.String(), Serdes.Long()));
    }

    /**
     * Mirrors `guests/dsl-page-views`: views keyed by user, counted per user in tumbling
     * windows of a minute (store `views_per_minute`, to `per_minute`) and in hopping windows of
     * five minutes advancing by a minute (store `views_per_5_minutes`, to `per_5_minutes`),
     * both with 30 s of grace, each window sent once when it closes as user →
     * "&lt;start&gt; &lt;end&gt; &lt;count&gt;".
     */
    static void pageViews(StreamsBuilder b, Roles r) {
        Duration minute = Duration.ofSeconds(60);
        Duration grace = Duration.ofSeconds(30);
        KGroupedStream<String, String> byUser = b
                .stream(r.topic("views"), Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
        byUser.windowedBy(TimeWindows.ofSizeAndGrace(minute, grace))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(finalWindowStore("views_per_minute"))
                .toStream()
                .map(Dsl::pageViewsLine)
                .to(r.topic("per_minute"), Produced.with(Serdes.String(), Serdes.String()));
        byUser.windowedBy(TimeWindows.ofSizeAndGrace(minute.multipliedBy(5), grace).advanceBy(minute))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(finalWindowStore("views_per_5_minutes"))
                .toStream()
                .map(Dsl::pageViewsLine)
                .to(r.topic("per_5_minutes"), Produced.with(Serdes.String(), Serdes.String()));
    }

    /** `line` of dsl-page-views: `(window.key, format!("{} {} {count}", window.start, window.end))`. */
    private static KeyValue<String, String> pageViewsLine(Windowed<String> window, Long count) {
        long n = count == null ? 0 : count;
        return KeyValue.pair(window.key(), window.window().start() + " " + window.window().end() + " " + n);
    }

    /**
     * Mirrors `guests/dsl-sessions`: clicks keyed by user, sessions with an inactivity gap of
     * two minutes and a minute of grace, counted in the store `sessions`, each session sent
     * once when it closes to `sessions` as user → "&lt;start&gt; &lt;end&gt; &lt;clicks&gt;".
     */
    static void sessions(StreamsBuilder b, Roles r) {
        Duration gap = Duration.ofSeconds(120);
        Duration grace = Duration.ofSeconds(60);
        b.stream(r.topic("clicks"), Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .windowedBy(SessionWindows.ofInactivityGapAndGrace(gap, grace))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as("sessions")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long())
                        .withRetention(FINAL_RETENTION)) // see FINAL_RETENTION
                .toStream()
                .map((session, clicks) -> {
                    long n = clicks == null ? 0 : clicks;
                    // A Kafka Streams session window's end() is its last record's time (both
                    // ends inclusive); Sluice's Windowed.end is one past it (end exclusive, as
                    // for time windows): the guest prints last + 1.
                    long end = session.window().end() + 1;
                    return KeyValue.pair(session.key(), session.window().start() + " " + end + " " + n);
                })
                .to(r.topic("sessions"), Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * Mirrors `guests/dsl-orders-payments`: orders left-joined with the payments of the same
     * key made within ten minutes after them (none before), two minutes of grace, to `paid`:
     * "&lt;order&gt; paid by &lt;payment&gt;" per pair, "&lt;order&gt; unpaid" once for an
     * order no payment joined.
     */
    static void ordersPayments(StreamsBuilder b, Roles r) {
        Duration window = Duration.ofSeconds(600);
        Duration grace = Duration.ofSeconds(120);
        KStream<String, String> orders = b.stream(r.topic("orders"), Consumed.with(Serdes.String(), Serdes.String()));
        KStream<String, String> payments = b.stream(r.topic("payments"), Consumed.with(Serdes.String(), Serdes.String()));
        orders.leftJoin(
                        payments,
                        (order, payment) -> payment == null ? order + " unpaid" : order + " paid by " + payment,
                        JoinWindows.ofTimeDifferenceAndGrace(window, grace).before(Duration.ZERO),
                        StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String()))
                .to(r.topic("paid"), Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * Mirrors `guests/dsl-enrich-orders`: orders keyed by customer, left-joined with the table
     * `customers` (store `customers`) to `enriched` and with the global table `directory`
     * (store `directory`), looked up by the order's key, to `enriched_global`; both send
     * "&lt;order&gt; for &lt;name&gt;" or "&lt;order&gt; for unknown customer".
     */
    static void enrichOrders(StreamsBuilder b, Roles r) {
        KTable<String, String> customers = b.table(r.topic("customers"),
                Consumed.with(Serdes.String(), Serdes.String()),
                tableStore("customers", Serdes.String(), Serdes.String()));
        GlobalKTable<String, String> directory = b.globalTable(r.topic("directory"),
                Consumed.with(Serdes.String(), Serdes.String()),
                keyValueStore("directory", Serdes.String(), Serdes.String()));
        KStream<String, String> orders = b.stream(r.topic("orders"), Consumed.with(Serdes.String(), Serdes.String()));
        orders.leftJoin(customers, Dsl::enriched, Joined.with(Serdes.String(), Serdes.String(), Serdes.String()))
                .to(r.topic("enriched"), Produced.with(Serdes.String(), Serdes.String()));
        orders.leftJoin(directory, (customer, order) -> customer, Dsl::enriched)
                .to(r.topic("enriched_global"), Produced.with(Serdes.String(), Serdes.String()));
    }

    /** `enriched` of dsl-enrich-orders. */
    private static String enriched(String order, String customer) {
        String name = customer == null ? "unknown customer" : customer;
        return order + " for " + name;
    }

    /** The value of dsl-revenue's table-table join: `(customer, amount, status)`. */
    private record PaidOrder(String customer, long amount, String status) {}

    /**
     * Mirrors `guests/dsl-revenue`: the table `orders` (JSON orders, store `orders`) joined
     * with the table `statuses` (store `statuses`); the paid orders grouped by customer
     * through the repartition topic `paid_by_customer` and their amounts summed, with
     * retraction, in the store `revenue_per_customer`; each revenue to `revenue` as customer →
     * "&lt;revenue&gt;" (text).
     */
    static void revenue(StreamsBuilder b, Roles r) {
        KTable<String, Order> orders = b.table(r.topic("orders"),
                Consumed.with(Serdes.String(), OrderJson.serde()),
                tableStore("orders", Serdes.String(), OrderJson.serde()));
        KTable<String, String> statuses = b.table(r.topic("statuses"),
                Consumed.with(Serdes.String(), Serdes.String()),
                tableStore("statuses", Serdes.String(), Serdes.String()));
        orders.join(statuses, (order, status) -> new PaidOrder(order.customer(), order.amount(), status))
                .filter((id, paid) -> paid.status().equals("paid"))
                .groupBy((id, paid) -> KeyValue.pair(paid.customer(), paid.amount()),
                        Grouped.<String, Long>as("paid_by_customer")
                                .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
                .aggregate(
                        () -> 0L,
                        (customer, amount, revenue) -> revenue + amount,
                        (customer, amount, revenue) -> revenue - amount,
                        keyValueStore("revenue_per_customer", Serdes.String(), Serdes.Long()))
                .toStream()
                .mapValues(revenue -> revenue == null ? "0" : Long.toString(revenue))
                .to(r.topic("revenue"), Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * Mirrors `guests/dsl-windowed-count`: events keyed by user (values not read) counted in
     * tumbling windows of a minute with 10 s of grace (store `counts`), every update to
     * `counts` as "user@&lt;window start&gt;" → "&lt;count&gt;" (text).
     */
    static void windowedCount(StreamsBuilder b, Roles r) {
        b.stream(r.topic("events"), Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(60), Duration.ofSeconds(10)))
                .count(windowStore("counts"))
                .toStream()
                .map((window, n) -> KeyValue.pair(
                        window.key() + "@" + window.window().start(), Long.toString(n == null ? 0 : n)))
                .to(r.topic("counts"), Produced.with(Serdes.String(), Serdes.String()));
    }

    /**
     * Mirrors `guests/dsl-activity`: clicks (user → page) and purchases (user → item), tables
     * profiles (user → name) and plans (user → plan).
     * <ul>
     * <li>`sliding`: clicks per user in sliding windows of 60 s with 30 s of grace (store
     * `clicks_sliding`), each window once when it closes: user → "&lt;start&gt; &lt;end + 1&gt;
     * &lt;count&gt;" (Sluice's end is exclusive);</li>
     * <li>`session_updates`: sessions (gap 120 s, grace 60 s, store `clicks_sessions`), every
     * update: "&lt;user&gt; &lt;start&gt; &lt;end + 1&gt;" → "&lt;count&gt;" or null;</li>
     * <li>`hopping_updates`: hopping windows of 60 s advancing by 20 s, 10 s of grace (store
     * `clicks_hopping`), every update: "&lt;user&gt;@&lt;start&gt;" → "&lt;count&gt;";</li>
     * <li>`bought_after_click`, `click_or_purchase`: clicks joined with purchases at most 60 s
     * apart either way, 30 s of grace, inner ("page → item") and outer ("- " for a missing
     * side);</li>
     * <li>`profile_plans`, `profiles_or_plans`: the tables' left join ("name/plan", "-" for no
     * plan) and outer join.</li>
     * </ul>
     */
    static void activity(StreamsBuilder b, Roles r) {
        KStream<String, String> clicks = b.stream(r.topic("clicks"), Consumed.with(Serdes.String(), Serdes.String()));
        KStream<String, String> purchases = b.stream(r.topic("purchases"), Consumed.with(Serdes.String(), Serdes.String()));
        KGroupedStream<String, String> byUser = clicks.groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
        byUser.windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofSeconds(60), Duration.ofSeconds(30)))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(finalWindowStore("clicks_sliding"))
                .toStream()
                .map((w, n) -> KeyValue.pair(w.key(),
                        w.window().start() + " " + (w.window().end() + 1) + " " + (n == null ? 0 : n)))
                .to(r.topic("sliding"), Produced.with(Serdes.String(), Serdes.String()));
        // Without the record cache: with it, a session that closed stays visible to merges
        // until the cache flushes (the session store itself hides it once past gap + grace),
        // so whether a late click extends it depends on when Kafka Streams commits.
        byUser.windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofSeconds(120), Duration.ofSeconds(60)))
                .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as("clicks_sessions")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long())
                        .withCachingDisabled())
                .toStream()
                .map((w, n) -> KeyValue.pair(
                        w.key() + " " + w.window().start() + " " + (w.window().end() + 1),
                        n == null ? null : Long.toString(n)))
                .to(r.topic("session_updates"), Produced.with(Serdes.String(), Serdes.String()));
        byUser.windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(60), Duration.ofSeconds(10))
                        .advanceBy(Duration.ofSeconds(20)))
                .count(windowStore("clicks_hopping"))
                .toStream()
                .map((w, n) -> KeyValue.pair(w.key() + "@" + w.window().start(), Long.toString(n == null ? 0 : n)))
                .to(r.topic("hopping_updates"), Produced.with(Serdes.String(), Serdes.String()));
        JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofSeconds(60), Duration.ofSeconds(30));
        StreamJoined<String, String, String> joined = StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String());
        clicks.join(purchases, (page, item) -> page + " → " + item, windows, joined)
                .to(r.topic("bought_after_click"), Produced.with(Serdes.String(), Serdes.String()));
        clicks.outerJoin(purchases, (page, item) -> orDash(page) + " → " + orDash(item), windows, joined)
                .to(r.topic("click_or_purchase"), Produced.with(Serdes.String(), Serdes.String()));
        // Kafka Streams' default: the tables' stores are cached (Sluice's are not; the
        // differential test compares the joins' last value per key).
        KTable<String, String> profiles = b.table(r.topic("profiles"),
                Consumed.with(Serdes.String(), Serdes.String()),
                keyValueStore("profiles", Serdes.String(), Serdes.String()));
        KTable<String, String> plans = b.table(r.topic("plans"),
                Consumed.with(Serdes.String(), Serdes.String()),
                keyValueStore("plans", Serdes.String(), Serdes.String()));
        profiles.leftJoin(plans, (name, plan) -> name + "/" + orDash(plan))
                .toStream()
                .to(r.topic("profile_plans"), Produced.with(Serdes.String(), Serdes.String()));
        profiles.outerJoin(plans, (name, plan) -> orDash(name) + "/" + orDash(plan))
                .toStream()
                .to(r.topic("profiles_or_plans"), Produced.with(Serdes.String(), Serdes.String()));
    }

    private static String orDash(String value) {
        return value == null ? "-" : value;
    }

    // ---------------------------------------------------------------------------------------
    // Stores and the command line.

    private static <K, V> Materialized<K, V, KeyValueStore<Bytes, byte[]>> keyValueStore(
            String name, Serde<K> keys, Serde<V> values) {
        return Materialized.<K, V, KeyValueStore<Bytes, byte[]>>as(name).withKeySerde(keys).withValueSerde(values);
    }

    /**
     * The store of a source table. Not Kafka Streams' default: Sluice's record cache is only
     * in front of aggregations (a table's updates always go on at once), so the table's store
     * here has no cache either. With it, a table-table join whose two sides both change a key
     * within one commit computes the retraction of its old result from the other side's
     * current value, not from the result it sent: seen here, dsl-revenue's sums came out
     * different on each run tried, up to nearly three times the truth. Sluice does not cache tables for that
     * reason (README, "Where this differs from Kafka Streams").
     */
    private static <K, V> Materialized<K, V, KeyValueStore<Bytes, byte[]>> tableStore(
            String name, Serde<K> keys, Serde<V> values) {
        return keyValueStore(name, keys, values).withCachingDisabled();
    }

    private static Materialized<String, Long, WindowStore<Bytes, byte[]>> windowStore(String name) {
        return Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(name)
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long());
    }

    /**
     * The retention of the stores of emit-final aggregations. Not Kafka Streams' default (a
     * window's size, or a session's gap, plus the grace period): a record puts its window
     * into the store, which drops the segments older than stream time minus the retention,
     * before the operator looks for closed windows to send; when stream time jumps by more
     * than the retention, windows that closed in the jump are dropped unsent. Sluice sends
     * every window once it has closed, so the mirror keeps them a day (Kafka Streams' old
     * default retention); the grace period alone still decides which records are late.
     */
    private static final Duration FINAL_RETENTION = Duration.ofDays(1);

    private static Materialized<String, Long, WindowStore<Bytes, byte[]>> finalWindowStore(String name) {
        return windowStore(name).withRetention(FINAL_RETENTION);
    }

    /**
     * The ROLE=TOPIC arguments. A topology asks for each of its roles with {@link #topic};
     * {@link #check} then refuses a role it asked for and was not given, and one given that it
     * did not ask for.
     */
    static final class Roles {
        private final String topology;
        private final Map<String, String> given = new LinkedHashMap<>();
        private final Set<String> asked = new LinkedHashSet<>();

        Roles(String topology) {
            this.topology = topology;
        }

        void bind(String arg) {
            int eq = arg.indexOf('=');
            if (eq <= 0 || eq == arg.length() - 1) {
                usage("expected ROLE=TOPIC, not " + arg);
            }
            String role = arg.substring(0, eq);
            if (given.put(role, arg.substring(eq + 1)) != null) {
                usage("role " + role + " given twice");
            }
        }

        /** The topic of `role` (a placeholder if missing: {@link #check} reports it). */
        String topic(String role) {
            asked.add(role);
            return given.getOrDefault(role, "missing-role-" + role);
        }

        void check() {
            String roles = " for " + topology + " (its roles: " + String.join(", ", asked) + ")";
            List<String> missing = asked.stream().filter(role -> !given.containsKey(role)).toList();
            if (!missing.isEmpty()) {
                usage("missing role " + String.join("=TOPIC, ", missing) + "=TOPIC" + roles);
            }
            List<String> unknown = given.keySet().stream().filter(role -> !asked.contains(role)).toList();
            if (!unknown.isEmpty()) {
                usage("unknown role " + String.join(", ", unknown) + roles);
            }
        }
    }

    /** Exits 2 with `message` (typed to fit any expression). */
    private static <T> T usage(String message) {
        System.err.println("Dsl: " + message);
        System.err.println("usage: Dsl BOOTSTRAP APPLICATION_ID GUARANTEE CACHE_BYTES TOPOLOGY ROLE=TOPIC...");
        System.exit(2);
        throw new AssertionError();
    }
}
