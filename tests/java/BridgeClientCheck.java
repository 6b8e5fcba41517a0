import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.edgespec.bridge.BridgeClient;

/**
 * Drives the Android app's BridgeClient through one session against a live bridge and prints every
 * event it parsed, re-encoded, one per line; tests/server/test_bridge.py checks them against the protocol.
 * Usage: java BridgeClientCheck PORT PROMPT
 */
public final class BridgeClientCheck {
    private static final BlockingQueue<BridgeClient.Event> EVENTS = new LinkedBlockingQueue<>();

    public static void main(String[] args) throws Exception {
        try (BridgeClient client = BridgeClient.connect("127.0.0.1", Integer.parseInt(args[0]), 5000)) {
            System.out.println(client.readReady());
            client.start(new BridgeClient.Listener() {
                @Override public void onEvent(BridgeClient.Event event) { EVENTS.add(event); }
                @Override public void onClosed(java.io.IOException error) {}
            });
            String generate = client.generate(args[1], Map.of("max_tokens", 24));
            printUntil(generate, Set.of("stats", "cancelled", "error"));
            String chat = client.newId();  // as the app does: the id is known before the first token
            client.chat(chat, List.of(Map.of("role", "user", "content", "Count from 1 to 500.")),
                        Map.of("max_tokens", 2000));
            printUntil(chat, Set.of("token"));
            client.cancel(chat);
            printUntil(chat, Set.of("stats", "cancelled", "error"));
            printUntil(client.stats(), Set.of("metrics"));
            printUntil(client.shutdown(), Set.of("bye"));
        }
    }

    private static void printUntil(String id, Set<String> kinds) throws InterruptedException {
        while (true) {
            BridgeClient.Event event = EVENTS.poll(60, TimeUnit.SECONDS);
            if (event == null) throw new IllegalStateException("no event for " + id + " within 60 s");
            System.out.println(event);
            if (id.equals(event.id()) && kinds.contains(event.kind())) return;
        }
    }
}
