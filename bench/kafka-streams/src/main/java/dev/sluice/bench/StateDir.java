package dev.sluice.bench;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

/** A Kafka Streams state directory for one run of a bench job, removed when it ends. */
final class StateDir {
    private StateDir() {}

    static Path of(String applicationId) {
        return Path.of(System.getProperty("java.io.tmpdir"), "kstreams-" + applicationId);
    }

    /** Removes the directory and all in it (called after `KafkaStreams#close`). */
    static void remove(Path dir) {
        try (Stream<Path> paths = Files.walk(dir)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            System.err.println("removing " + dir + ": " + e);
        }
    }
}
