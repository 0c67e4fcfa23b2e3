"""What every command and run tool shares, below all of them: exit statuses and the
usage error (status), the one atomic writer and the bounded file reader (files), the
diagnostics' renderers (render), and bounded, schema-checked JSON (readers)."""
