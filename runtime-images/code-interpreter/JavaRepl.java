// The Java context of the code interpreter (Debian packages no Java Jupyter kernel): one JVM per
// context driving the JDK's own JShell API (module jdk.jshell) with local execution, so every
// snippet's classes, variables and methods stay in this JVM across executions and no debugger
// connection (JDI over a socket, which a sandbox without egress may not open) is needed.
//
// Protocol with contexts.py. Each stdin line is "<token> <code> [<name>:<value> ...]", every
// field base64 (the name/value pairs are the execution's env vars, set as system properties for
// that execution and put back after, as E2B's Java kernel exposes them). On the fd named by
// AEGIS_CI_REPORT_FD this program writes frames "<kind> <length>\n<bytes>": "stdout"/"stderr"
// for each write of System.out/System.err (println's text and its newline are two writes, as
// Java kernels stream them), then one "end" frame whose bytes are a JSON report
// {"token", "result": mime bundle | null} or {"token", "error": {name, value, traceback}}.
// SIGINT (the server's interrupt) stops the running snippet through JShell.stop().

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Collectors;

import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;
import sun.misc.Signal;

public final class JavaRepl {
    /** The imports jshell's default start-up gives every session, so cells read the same. */
    private static final String[] IMPORTS = {
        "java.io.*", "java.math.*", "java.net.*", "java.nio.file.*", "java.util.*",
        "java.util.concurrent.*", "java.util.function.*", "java.util.prefs.*", "java.util.regex.*",
        "java.util.stream.*",
    };

    private static OutputStream report;
    /** Whether a cell is running, and whether an interrupt stopped it. */
    private static volatile boolean running;
    private static volatile boolean stopped;

    private JavaRepl() {}

    /** One frame on the report fd; frames of concurrent writers never interleave. */
    static synchronized void frame(String kind, byte[] data, int off, int len) {
        try {
            report.write((kind + " " + len + "\n").getBytes(StandardCharsets.US_ASCII));
            report.write(data, off, len);
            report.flush();
        } catch (IOException e) {
            // The server is gone: nothing is left to report to.
            Runtime.getRuntime().halt(3);
        }
    }

    /** Each write of a snippet's System.out or System.err becomes one frame of that stream. */
    static final class FramedOutput extends OutputStream {
        private final String kind;

        FramedOutput(String kind) {
            this.kind = kind;
        }

        @Override
        public void write(int b) {
            frame(kind, new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public void write(byte[] b, int off, int len) {
            if (len > 0) {
                frame(kind, b, off, len);
            }
        }
    }

    /** A subclass, so println writes its text and its line end apart (PrintStream's own class
     * joins them into one write). */
    static final class CellStream extends PrintStream {
        CellStream(String kind) {
            super(new FramedOutput(kind), true, StandardCharsets.UTF_8);
        }
    }

    public static void main(String[] args) throws IOException {
        String fd = System.getenv("AEGIS_CI_REPORT_FD");
        if (fd == null || !fd.matches("[0-9]+")) {
            System.err.println("JavaRepl: AEGIS_CI_REPORT_FD is not set");
            System.exit(2);
        }
        report = new FileOutputStream("/dev/fd/" + fd);
        // The sandbox's env vars, readable as System.getProperty(NAME) as E2B's Java kernel reads
        // them; the JVM's own properties (java.*, user.*, ...) are never replaced.
        for (Map.Entry<String, String> e : System.getenv().entrySet()) {
            if (!e.getKey().equals("AEGIS_CI_REPORT_FD") && System.getProperty(e.getKey()) == null) {
                System.setProperty(e.getKey(), e.getValue());
            }
        }
        PrintStream out = new CellStream("stdout");
        PrintStream err = new CellStream("stderr");
        System.setOut(out);
        System.setErr(err);
        // Cells read an empty stdin; the requests arrive on the real one.
        System.setIn(InputStream.nullInputStream());
        JShell shell = JShell.builder()
            .executionEngine("local")
            .in(InputStream.nullInputStream())
            .out(out)
            .err(err)
            .build();
        for (String name : IMPORTS) {
            shell.eval("import " + name + ";");
        }
        Signal.handle(new Signal("INT"), s -> {
            if (running) {
                stopped = true;
                shell.stop();
            }
        });
        BufferedReader in = new BufferedReader(
            new InputStreamReader(new FileInputStream(FileDescriptor.in), StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.split(" ", -1);
            if (words.length < 2) {
                continue; // not a request contexts.py writes
            }
            String token = decode(words[0]);
            String answer;
            Map<String, String> saved = new LinkedHashMap<>();
            try {
                for (int i = 2; i < words.length; i++) {
                    int colon = words[i].indexOf(':');
                    if (colon <= 0) {
                        continue;
                    }
                    String name = decode(words[i].substring(0, colon));
                    saved.put(name, System.getProperty(name));
                    System.setProperty(name, decode(words[i].substring(colon + 1)));
                }
                stopped = false;
                running = true;
                answer = run(shell, decode(words[1]));
            } catch (RuntimeException e) {
                // An internal failure of JShell itself, not of the cell.
                answer = error(e.getClass().getName(), String.valueOf(e.getMessage()), stackTrace(e));
            } finally {
                running = false;
                for (Map.Entry<String, String> e : saved.entrySet()) {
                    if (e.getValue() == null) {
                        System.clearProperty(e.getKey());
                    } else {
                        System.setProperty(e.getKey(), e.getValue());
                    }
                }
            }
            out.flush();
            err.flush();
            byte[] bytes = ("{\"token\": " + json(token) + ", " + answer + "}").getBytes(StandardCharsets.UTF_8);
            frame("end", bytes, 0, bytes.length);
        }
        System.exit(0);
    }

    private static String decode(String b64) {
        return new String(Base64.getDecoder().decode(b64), StandardCharsets.UTF_8);
    }

    /** Evaluates a cell snippet by snippet; the report's fields ("result" or "error"). */
    static String run(JShell shell, String code) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String remaining = code;
        String value = null;
        while (!remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            String source;
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) {
                break;
            } else if (info.completeness().isComplete()) {
                source = info.source();
                remaining = info.remaining();
            } else {
                // Incomplete: evaluated as it is, so the compiler says what is missing.
                source = remaining;
                remaining = "";
            }
            value = null;
            List<SnippetEvent> events = shell.eval(source);
            if (stopped) {
                return error("KeyboardInterrupt", "the execution was interrupted", "");
            }
            for (SnippetEvent event : events) {
                if (event.causeSnippet() != null) {
                    continue; // a dependent snippet updated, not this cell's own
                }
                Snippet snippet = event.snippet();
                if (event.status() == Snippet.Status.REJECTED) {
                    return compileError(shell, snippet, source);
                }
                JShellException thrown = event.exception();
                if (thrown != null) {
                    return thrownError(thrown);
                }
                if (shows(snippet) && event.value() != null) {
                    value = text(shell, snippet, event.value());
                }
            }
        }
        if (value == null) {
            return "\"result\": null";
        }
        return "\"result\": {\"text/plain\": " + json(value) + "}";
    }

    /** An expression's snippet (kept as a temporary variable $N or not): its value is the cell's. */
    private static boolean shows(Snippet snippet) {
        return snippet.kind() == Snippet.Kind.EXPRESSION
            || snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
    }

    private static String compileError(JShell shell, Snippet snippet, String source) {
        List<Diag> diags = shell.diagnostics(snippet).collect(Collectors.toList());
        List<String> messages = new ArrayList<>();
        StringBuilder trace = new StringBuilder();
        for (Diag d : diags) {
            if (!d.isError()) {
                continue;
            }
            String message = d.getMessage(Locale.ROOT);
            messages.add(message);
            trace.append(message).append('\n');
            long at = d.getStartPosition();
            if (at >= 0 && at <= source.length()) {
                int start = source.lastIndexOf('\n', (int) Math.max(0, at - 1)) + 1;
                int end = source.indexOf('\n', (int) at);
                String line = source.substring(start, end < 0 ? source.length() : end);
                trace.append(line).append('\n').append(" ".repeat((int) at - start)).append("^\n");
            }
        }
        String value = messages.isEmpty() ? "the snippet was rejected: " + snippet.source().strip() : String.join("\n", messages);
        return error("CompilationError", value, trace.toString().stripTrailing());
    }

    private static String thrownError(JShellException thrown) {
        if (thrown instanceof EvalException) {
            EvalException e = (EvalException) thrown;
            String name = e.getExceptionClassName();
            String message = e.getMessage() == null ? "" : e.getMessage();
            return error(name, message, stackTrace(e));
        }
        if (thrown instanceof UnresolvedReferenceException) {
            Snippet s = ((UnresolvedReferenceException) thrown).getSnippet();
            return error("UnresolvedReferenceException",
                "a definition used here refers to something not declared yet: " + s.source().strip(),
                s.source().strip());
        }
        return error(thrown.getClass().getName(), String.valueOf(thrown.getMessage()), stackTrace(thrown));
    }

    /** "Name: message" and the frames of the cell's code (JShell's and reflection's dropped),
     * then each cause the same way. */
    static String stackTrace(Throwable t) {
        StringBuilder b = new StringBuilder();
        for (int depth = 0; t != null && depth < 16; depth++, t = t.getCause()) {
            String name = t instanceof EvalException ? ((EvalException) t).getExceptionClassName() : t.getClass().getName();
            if (depth > 0) {
                b.append("Caused by: ");
            }
            b.append(name);
            if (t.getMessage() != null) {
                b.append(": ").append(t.getMessage());
            }
            b.append('\n');
            for (StackTraceElement f : t.getStackTrace()) {
                String cls = f.getClassName();
                if (cls.startsWith("jdk.jshell.") || cls.startsWith("jdk.internal.reflect.")
                    || cls.startsWith("java.lang.reflect.")) {
                    continue;
                }
                b.append("\tat ");
                if (cls.isEmpty()) {
                    // A snippet's own code: JShell names its file "#<snippet id>".
                    b.append(f.getMethodName()).append('(').append(f.getFileName()).append(':').append(f.getLineNumber()).append(')');
                } else {
                    b.append(f);
                }
                b.append('\n');
            }
        }
        return b.toString().stripTrailing();
    }

    private static String error(String name, String value, String traceback) {
        return "\"error\": {\"name\": " + json(name) + ", \"value\": " + json(value)
            + ", \"traceback\": " + json(traceback) + "}";
    }

    /** The text of a value JShell showed as a String literal: that display leaves backslashes
     * as they are and escapes control characters, so it cannot be read back; the variable
     * holding the value (the expression's temporary $N, or the variable an expression named) is
     * read again through Base64, whose display needs no escapes, and that helper snippet is
     * dropped. Anything else is shown as JShell shows it (String.valueOf). */
    static String text(JShell shell, Snippet snippet, String shown) {
        if (!shown.startsWith("\"")) {
            return shown;
        }
        String name = snippet instanceof VarSnippet ? ((VarSnippet) snippet).name()
            : snippet instanceof ExpressionSnippet ? ((ExpressionSnippet) snippet).name() : null;
        if (name == null) {
            return shown;
        }
        String encoded = null;
        for (SnippetEvent event : shell.eval("java.util.Base64.getEncoder().encodeToString(String.valueOf("
                + name + ").getBytes(java.nio.charset.StandardCharsets.UTF_8))")) {
            if (event.causeSnippet() == null) {
                if (event.exception() == null && event.value() != null) {
                    encoded = event.value();
                }
                shell.drop(event.snippet());
            }
        }
        if (encoded == null || encoded.length() < 2) {
            return shown;
        }
        return new String(Base64.getDecoder().decode(encoded.substring(1, encoded.length() - 1)),
            StandardCharsets.UTF_8);
    }

    /** A string as a JSON string literal. */
    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }
}
