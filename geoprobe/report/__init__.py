"""Tables (terminal, Markdown, JSON) and progress display."""
