package dev.sluice.bench;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;

import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;

/**
 * The order of the `dsl-revenue` guest, `Json<Order>` in Sluice's SDK: serde_json of
 * `struct Order { customer: String, amount: i64 }`, e.g. `{"customer":"c-7","amount":1250}`.
 *
 * <p>Read as serde_json reads it into that struct (`serde_json::from_slice`): an object whose
 * fields come in any order, with JSON whitespace (space, tab, CR, LF) anywhere between tokens;
 * fields other than these two are skipped (their values must still be valid JSON); a missing
 * or repeated field, a non-string `customer`, an `amount` that is not an integer within i64
 * (a fraction or an exponent is a float: refused), or anything after the value is an error.
 * serde's derive also accepts the struct as a sequence, `["c-7",1250]`, and so does this. A
 * null (tombstone) value is a null order. Written as serde_json writes it (field order as
 * declared, no whitespace), so that a store's changelog holds the same bytes. No JSON library:
 * this is the whole grammar the one struct needs.
 */
final class OrderJson {
    private OrderJson() {}

    /** An order: the customer it belongs to and its amount in cents. */
    record Order(String customer, long amount) {}

    /** serde_json's nesting limit, for values skipped inside an order. */
    private static final int MAX_DEPTH = 128;

    static Serde<Order> serde() {
        return Serdes.serdeFrom(
                (topic, order) -> order == null ? null : write(order).getBytes(StandardCharsets.UTF_8),
                (topic, bytes) -> bytes == null ? null : read(bytes));
    }

    /** `order` as serde_json writes it: `{"customer":"c-7","amount":1250}`. */
    static String write(Order order) {
        StringBuilder out = new StringBuilder("{\"customer\":");
        quote(order.customer(), out);
        return out.append(",\"amount\":").append(order.amount()).append('}').toString();
    }

    /** serde_json's string escaping: `"`, `\` and the control characters, nothing else. */
    private static void quote(String s, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    /** Parses `bytes` as serde_json parses them into an `Order`. */
    static Order read(byte[] bytes) {
        return new Reader(bytes).order();
    }

    private static final class Reader {
        private final byte[] in;
        private int pos;

        Reader(byte[] in) {
            this.in = in;
        }

        Order order() {
            skipWhitespace();
            Order order;
            if (peek() == '{') {
                order = object();
            } else if (peek() == '[') {
                order = sequence();
            } else {
                throw error("expected an object");
            }
            skipWhitespace();
            if (pos != in.length) {
                throw error("trailing characters");
            }
            return order;
        }

        private Order object() {
            pos++; // '{'
            String customer = null;
            Long amount = null;
            skipWhitespace();
            if (peek() == '}') {
                pos++;
            } else {
                while (true) {
                    skipWhitespace();
                    if (peek() != '"') {
                        throw error("expected a field name");
                    }
                    String field = string();
                    skipWhitespace();
                    expect(':');
                    skipWhitespace();
                    switch (field) {
                        case "customer" -> {
                            if (customer != null) {
                                throw error("duplicate field `customer`");
                            }
                            if (peek() != '"') {
                                throw error("`customer` is not a string");
                            }
                            customer = string();
                        }
                        case "amount" -> {
                            if (amount != null) {
                                throw error("duplicate field `amount`");
                            }
                            amount = integer();
                        }
                        default -> skipValue(1);
                    }
                    skipWhitespace();
                    int c = next();
                    if (c == '}') {
                        break;
                    }
                    if (c != ',') {
                        throw error("expected `,` or `}`");
                    }
                }
            }
            if (customer == null) {
                throw error("missing field `customer`");
            }
            if (amount == null) {
                throw error("missing field `amount`");
            }
            return new Order(customer, amount);
        }

        private Order sequence() {
            pos++; // '['
            skipWhitespace();
            if (peek() != '"') {
                throw error("expected `customer`, a string, first");
            }
            String customer = string();
            skipWhitespace();
            expect(',');
            skipWhitespace();
            long amount = integer();
            skipWhitespace();
            expect(']');
            return new Order(customer, amount);
        }

        /** An integer within i64: `-?(0|[1-9][0-9]*)`, no fraction, no exponent. */
        private long integer() {
            int start = pos;
            if (peek() == '-') {
                pos++;
            }
            int digits = pos;
            while (isDigit(peek())) {
                pos++;
            }
            if (pos == digits) {
                throw error("`amount` is not a number");
            }
            if (in[digits] == '0' && pos - digits > 1) {
                throw error("invalid number");
            }
            int c = peek();
            if (c == '.' || c == 'e' || c == 'E') {
                throw error("`amount` is a float, not an i64");
            }
            String text = new String(in, start, pos - start, StandardCharsets.US_ASCII);
            if (text.equals("-0")) {
                throw error("`amount` -0 is a float to serde_json, not an i64");
            }
            try {
                return Long.parseLong(text);
            } catch (NumberFormatException e) {
                throw error("`amount` " + text + " is out of i64's range");
            }
        }

        /** A string, escapes resolved; the result must be valid UTF-8 (serde_json's `parse_str`). */
        private String string() {
            pos++; // '"'
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            while (true) {
                int c = next();
                if (c == '"') {
                    break;
                }
                if (c < 0x20) {
                    throw error("control character in a string");
                }
                if (c != '\\') {
                    out.write(c);
                    continue;
                }
                int e = next();
                switch (e) {
                    case '"', '\\', '/' -> out.write(e);
                    case 'b' -> out.write('\b');
                    case 'f' -> out.write('\f');
                    case 'n' -> out.write('\n');
                    case 'r' -> out.write('\r');
                    case 't' -> out.write('\t');
                    case 'u' -> {
                        int unit = hex4();
                        int codePoint = unit;
                        if (unit >= 0xDC00 && unit <= 0xDFFF) {
                            throw error("lone trailing surrogate in hex escape");
                        }
                        if (unit >= 0xD800 && unit <= 0xDBFF) {
                            if (next() != '\\' || next() != 'u') {
                                throw error("unexpected end of hex escape");
                            }
                            int low = hex4();
                            if (low < 0xDC00 || low > 0xDFFF) {
                                throw error("lone leading surrogate in hex escape");
                            }
                            codePoint = Character.toCodePoint((char) unit, (char) low);
                        }
                        byte[] utf8 = new String(Character.toChars(codePoint)).getBytes(StandardCharsets.UTF_8);
                        out.write(utf8, 0, utf8.length);
                    }
                    default -> throw error("invalid escape");
                }
            }
            try {
                return StandardCharsets.UTF_8.newDecoder()
                        .onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT)
                        .decode(ByteBuffer.wrap(out.toByteArray()))
                        .toString();
            } catch (CharacterCodingException e) {
                throw error("invalid unicode code point");
            }
        }

        private int hex4() {
            int value = 0;
            for (int i = 0; i < 4; i++) {
                int digit = Character.digit(next(), 16);
                if (digit < 0) {
                    throw error("invalid escape");
                }
                value = value * 16 + digit;
            }
            return value;
        }

        /** Skips any JSON value, checking its syntax (serde_json's `IgnoredAny`). */
        private void skipValue(int depth) {
            if (depth > MAX_DEPTH) {
                throw error("recursion limit exceeded");
            }
            int c = peek();
            switch (c) {
                case '"' -> skipString();
                case '{' -> skipContainer('}', depth, true);
                case '[' -> skipContainer(']', depth, false);
                case 't' -> literal("true");
                case 'f' -> literal("false");
                case 'n' -> literal("null");
                default -> {
                    if (c == '-' || isDigit(c)) {
                        skipNumber();
                    } else {
                        throw error("expected a value");
                    }
                }
            }
        }

        /** A skipped string is scanned, not decoded: serde_json does not check its UTF-8. */
        private void skipString() {
            pos++; // '"'
            while (true) {
                int c = next();
                if (c == '"') {
                    return;
                }
                if (c < 0x20) {
                    throw error("control character in a string");
                }
                if (c == '\\') {
                    int e = next();
                    if (e == 'u') {
                        hex4();
                    } else if ("\"\\/bfnrt".indexOf(e) < 0) {
                        throw error("invalid escape");
                    }
                }
            }
        }

        private void skipContainer(char close, int depth, boolean object) {
            pos++; // '{' or '['
            skipWhitespace();
            if (peek() == close) {
                pos++;
                return;
            }
            while (true) {
                skipWhitespace();
                if (object) {
                    if (peek() != '"') {
                        throw error("expected a field name");
                    }
                    skipString();
                    skipWhitespace();
                    expect(':');
                    skipWhitespace();
                }
                skipValue(depth + 1);
                skipWhitespace();
                int c = next();
                if (c == close) {
                    return;
                }
                if (c != ',') {
                    throw error("expected `,` or `" + close + "`");
                }
            }
        }

        /** `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` */
        private void skipNumber() {
            if (peek() == '-') {
                pos++;
            }
            if (peek() == '0') {
                pos++;
            } else if (isDigit(peek())) {
                digits();
            } else {
                throw error("invalid number");
            }
            if (peek() == '.') {
                pos++;
                digits();
            }
            if (peek() == 'e' || peek() == 'E') {
                pos++;
                if (peek() == '+' || peek() == '-') {
                    pos++;
                }
                digits();
            }
        }

        private void digits() {
            if (!isDigit(peek())) {
                throw error("invalid number");
            }
            while (isDigit(peek())) {
                pos++;
            }
        }

        private void literal(String word) {
            for (int i = 0; i < word.length(); i++) {
                if (next() != word.charAt(i)) {
                    throw error("expected a value");
                }
            }
        }

        private void skipWhitespace() {
            while (pos < in.length && (in[pos] == ' ' || in[pos] == '\t' || in[pos] == '\n' || in[pos] == '\r')) {
                pos++;
            }
        }

        private void expect(char c) {
            if (next() != c) {
                throw error("expected `" + c + "`");
            }
        }

        /** The next byte (0..255) without taking it, or -1 at the end. */
        private int peek() {
            return pos < in.length ? in[pos] & 0xFF : -1;
        }

        /** Takes the next byte (0..255); the end is an error. */
        private int next() {
            if (pos >= in.length) {
                throw error("EOF while parsing");
            }
            return in[pos++] & 0xFF;
        }

        private static boolean isDigit(int c) {
            return c >= '0' && c <= '9';
        }

        private SerializationException error(String what) {
            return new SerializationException("an order (Json<Order>) at byte " + pos + ": " + what);
        }
    }
}
