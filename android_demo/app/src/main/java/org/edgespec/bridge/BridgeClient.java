package org.edgespec.bridge;

import java.io.BufferedReader;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A client for the edgespec bridge protocol (docs/bridge-protocol.md), over a socket or a spawned
 * process's stdin/stdout. Requests are written from any thread; events arrive on one reader thread.
 * Plain Java with no Android classes, so the tests compile and run this very file against a real bridge.
 */
public final class BridgeClient implements Closeable {
    public static final long PROTOCOL = 1;

    /** Called on the reader thread: hand UI work to the main thread. */
    public interface Listener {
        void onEvent(Event event);

        /** The bridge closed the stream ({@code error} null) or reading failed. */
        void onClosed(IOException error);
    }

    /** One line from the bridge. */
    public static final class Event {
        public final Map<String, Object> fields;

        Event(Map<String, Object> fields) { this.fields = fields; }

        /** "ready", "token", "stats", "cancelled", "error", "loaded", "ok", "metrics" or "bye". */
        public String kind() { return (String) fields.get("event"); }

        /** The request this event is about (null for "ready" and for errors about unreadable lines). */
        public String id() { Object id = fields.get("id"); return id == null ? null : String.valueOf(id); }

        public String text() { return (String) fields.get("text"); }

        public long number(String key) { return ((Number) fields.get(key)).longValue(); }

        /** The last event of a generate/chat request. */
        public boolean endsGeneration() {
            String k = kind();
            return "stats".equals(k) || "cancelled".equals(k) || "error".equals(k);
        }

        @Override public String toString() { return Json.write(fields); }
    }

    private final BufferedReader in;
    private final Writer out;
    private final Closeable transport;
    private final AtomicLong nextId = new AtomicLong(1);

    public BridgeClient(InputStream in, OutputStream out, Closeable transport) {
        this.in = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
        this.out = new OutputStreamWriter(out, StandardCharsets.UTF_8);
        this.transport = transport;
    }

    /** Connect to {@code edgespec bridge --port PORT} (which listens on 127.0.0.1 only). */
    public static BridgeClient connect(String host, int port, int timeoutMs) throws IOException {
        Socket socket = new Socket();
        try {
            socket.connect(new InetSocketAddress(host, port), timeoutMs);
            socket.setTcpNoDelay(true);  // each request is one small line: send it now
            return new BridgeClient(socket.getInputStream(), socket.getOutputStream(), socket);
        } catch (IOException e) {
            socket.close();
            throw e;
        }
    }

    /** Read the session's first line, which must be the "ready" event of protocol 1. Call before start(). */
    public Event readReady() throws IOException {
        Event ready = readEvent();
        if (ready == null || !"ready".equals(ready.kind()) || ready.number("protocol") != PROTOCOL) {
            throw new IOException("not an edgespec bridge (protocol " + PROTOCOL + "): " + ready);
        }
        return ready;
    }

    /** Deliver every further event to {@code listener} on a new daemon thread. */
    public void start(Listener listener) {
        Thread reader = new Thread(() -> {
            try {
                for (Event e = readEvent(); e != null; e = readEvent()) listener.onEvent(e);
                listener.onClosed(null);
            } catch (IOException | RuntimeException e) {
                listener.onClosed(e instanceof IOException ? (IOException) e : new IOException(e));
            }
        }, "edgespec-bridge-reader");
        reader.setDaemon(true);
        reader.start();
    }

    private Event readEvent() throws IOException {
        String line = in.readLine();
        if (line == null) return null;
        Object parsed = Json.parse(line);
        if (!(parsed instanceof Map)) throw new IOException("not an event: " + line);
        @SuppressWarnings("unchecked") Map<String, Object> fields = (Map<String, Object>) parsed;
        return new Event(fields);
    }

    /**
     * A fresh request id. Take one before sending when events may race the send's return, e.g. a UI
     * that must know which reply it is showing before the first token arrives.
     */
    public String newId() { return "r" + nextId.getAndIncrement(); }

    /** Stream a completion of {@code prompt}; {@code options}: max_tokens, temperature, stop, ... Returns the id. */
    public String generate(String prompt, Map<String, Object> options) throws IOException {
        Map<String, Object> fields = new LinkedHashMap<>(options);
        fields.put("prompt", prompt);
        return send(newId(), "generate", fields);
    }

    /** Stream a chat reply under {@code id}; each message is {"role": ..., "content": ...}. */
    public String chat(String id, List<Map<String, String>> messages, Map<String, Object> options)
            throws IOException {
        Map<String, Object> fields = new LinkedHashMap<>(options);
        fields.put("messages", messages);
        return send(id, "chat", fields);
    }

    public String chat(List<Map<String, String>> messages, Map<String, Object> options) throws IOException {
        return chat(newId(), messages, options);
    }

    public String cancel(String target) throws IOException {
        Map<String, Object> fields = new LinkedHashMap<>();
        fields.put("target", target);
        return send(newId(), "cancel", fields);
    }

    public String load(String model) throws IOException {
        Map<String, Object> fields = new LinkedHashMap<>();
        fields.put("model", model);
        return send(newId(), "load", fields);
    }

    public String stats() throws IOException { return send(newId(), "stats", new LinkedHashMap<>()); }

    public String shutdown() throws IOException { return send(newId(), "shutdown", new LinkedHashMap<>()); }

    private String send(String id, String cmd, Map<String, Object> fields) throws IOException {
        Map<String, Object> request = new LinkedHashMap<>();
        request.put("id", id);
        request.put("cmd", cmd);
        request.putAll(fields);
        String line = Json.write(request) + "\n";
        synchronized (out) {  // one line at a time: requests from two threads must not interleave
            out.write(line);
            out.flush();
        }
        return id;
    }

    @Override public void close() throws IOException {
        transport.close();
    }
}
