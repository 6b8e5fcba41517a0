package org.edgespec.demo

import android.app.Activity
import android.content.Intent
import android.content.pm.PackageManager
import android.graphics.Color
import android.os.Bundle
import android.text.SpannableStringBuilder
import android.text.Spanned
import android.text.style.BackgroundColorSpan
import android.text.style.ForegroundColorSpan
import android.widget.Button
import android.widget.EditText
import android.widget.ScrollView
import android.widget.TextView
import java.io.IOException
import kotlin.concurrent.thread
import org.edgespec.bridge.BridgeClient

/**
 * Chat with edgespec running on this phone: connects to `edgespec bridge --port 8765` (started in
 * Termux, by hand or by this app through Termux's RUN_COMMAND service) and streams the reply, drafted
 * tokens in green. The protocol lives in docs/bridge-protocol.md; BridgeClient implements it.
 */
class MainActivity : Activity() {
    private lateinit var status: TextView
    private lateinit var output: TextView
    private lateinit var scroll: ScrollView
    private lateinit var prompt: EditText
    private lateinit var send: Button
    private val transcript = SpannableStringBuilder()
    private val messages = mutableListOf<Map<String, String>>()
    private val reply = StringBuilder()
    @Volatile private var client: BridgeClient? = null  // set by the connecting thread
    private var current: String? = null  // the id of the reply being streamed

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        status = findViewById(R.id.status)
        output = findViewById(R.id.output)
        scroll = findViewById(R.id.scroll)
        prompt = findViewById(R.id.prompt)
        send = findViewById(R.id.send)
        send.setOnClickListener { if (current == null) ask() else stop() }
        // A "dangerous" permission: asked for at run time, needed only to start the bridge in Termux.
        if (checkSelfPermission(RUN_COMMAND) != PackageManager.PERMISSION_GRANTED) {
            requestPermissions(arrayOf(RUN_COMMAND), 1)
        }
        thread(name = "edgespec-connect") { connect() }
    }

    override fun onDestroy() {
        super.onDestroy()
        thread { client?.close() }  // closing the socket makes the bridge cancel our generation
    }

    /** Network work stays off the main thread; every UI change is posted back to it. */
    private fun connect() {
        val bridge = tryConnect() ?: run {
            runOnUiThread { status.setText(R.string.starting_termux) }
            startBridgeInTermux()
            // The bridge loads the model first (a few seconds); poll for up to a minute.
            (1..60).firstNotNullOfOrNull { Thread.sleep(1000); tryConnect() }
        }
        if (bridge == null) {
            runOnUiThread { status.setText(R.string.no_bridge) }
            return
        }
        try {
            val ready = bridge.readReady()
            bridge.start(object : BridgeClient.Listener {
                override fun onEvent(event: BridgeClient.Event) = runOnUiThread { show(event) }
                override fun onClosed(error: IOException?) = runOnUiThread {
                    status.text = "bridge closed" + (error?.let { ": ${it.message}" } ?: "")
                    send.isEnabled = false
                }
            })
            client = bridge
            runOnUiThread {
                status.text = "connected · models ${ready.fields["models"]}"
                send.isEnabled = true
            }
        } catch (e: IOException) {
            runOnUiThread { status.text = "bridge error: ${e.message}" }
        }
    }

    private fun tryConnect(): BridgeClient? =
        try {
            BridgeClient.connect("127.0.0.1", PORT, 1000)
        } catch (e: IOException) {
            null
        }

    /** Termux's RUN_COMMAND service; needs allow-external-apps = true in ~/.termux/termux.properties. */
    private fun startBridgeInTermux() {
        val intent = Intent("com.termux.RUN_COMMAND")
            .setClassName("com.termux", "com.termux.app.RunCommandService")
            .putExtra("com.termux.RUN_COMMAND_PATH", "/data/data/com.termux/files/usr/bin/edgespec")
            .putExtra("com.termux.RUN_COMMAND_ARGUMENTS", arrayOf("bridge", "--port", PORT.toString()))
            .putExtra("com.termux.RUN_COMMAND_BACKGROUND", true)
        try {
            startService(intent)
        } catch (e: RuntimeException) {  // Termux missing, permission not granted, background limits
            runOnUiThread { status.text = "could not start Termux: ${e.message}" }
        }
    }

    private fun ask() {
        val text = prompt.text.toString().trim()
        val bridge = client ?: return
        if (text.isEmpty()) return
        prompt.text.clear()
        messages += mapOf("role" to "user", "content" to text)
        append("\n\nYou: $text\n\nedgespec: ", null)
        reply.setLength(0)
        send.setText(R.string.stop)
        val history = messages.toList()
        val id = bridge.newId()
        current = id  // before sending: the first token may arrive before chat() returns
        thread {
            try {
                bridge.chat(id, history, mapOf<String, Any>("max_tokens" to 256))
            } catch (e: IOException) {
                runOnUiThread { endReply("send failed: ${e.message}") }
            }
        }
    }

    private fun stop() {
        val id = current ?: return
        val bridge = client ?: return
        thread { runCatching { bridge.cancel(id) } }
    }

    private fun show(event: BridgeClient.Event) {
        if (event.id() == null && event.kind() == "error") {
            status.text = "bridge: ${event.fields["message"]}"
            return
        }
        if (event.id() != current) return  // e.g. the "ok" answering a cancel
        when (event.kind()) {
            "token" -> {
                val text = event.text()
                val drafted = event.number("draft_chars").toInt().coerceAtMost(text.length)
                append(text.substring(0, drafted), DRAFT_GREEN)
                append(text.substring(drafted), null)
                reply.append(text)
            }
            "stats" -> {
                @Suppress("UNCHECKED_CAST")
                val s = event.fields["stats"] as Map<String, Any?>
                endReply(String.format(
                    "%s tokens · %.1f tok/s · acceptance %.0f%% · %.2f tokens/step · mode %s",
                    s["generated_tokens"], (s["decode_tokens_per_s"] as Number).toDouble(),
                    100 * (s["acceptance_rate"] as Number).toDouble(),
                    (s["mean_accepted_per_step"] as Number).toDouble(), s["mode"]))
            }
            "cancelled" -> endReply("stopped")
            "error" -> endReply("error: ${event.fields["message"]}")
        }
    }

    private fun endReply(line: String) {
        messages += mapOf("role" to "assistant", "content" to reply.toString())
        current = null
        status.text = line
        send.setText(R.string.send)
    }

    private fun append(text: String, color: Int?) {
        val start = transcript.length
        transcript.append(text)
        if (color != null && text.isNotEmpty()) {
            transcript.setSpan(ForegroundColorSpan(color), start, transcript.length, Spanned.SPAN_EXCLUSIVE_EXCLUSIVE)
            transcript.setSpan(BackgroundColorSpan(DRAFT_BACKGROUND), start, transcript.length,
                               Spanned.SPAN_EXCLUSIVE_EXCLUSIVE)
        }
        output.text = transcript
        scroll.post { scroll.fullScroll(ScrollView.FOCUS_DOWN) }
    }

    companion object {
        const val PORT = 8765
        const val RUN_COMMAND = "com.termux.permission.RUN_COMMAND"
        val DRAFT_GREEN = Color.rgb(0x1f, 0x8f, 0x3a)
        val DRAFT_BACKGROUND = Color.rgb(0xe3, 0xf6, 0xe7)
    }
}
