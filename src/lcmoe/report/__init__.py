"""Plan reports a team can review: one self-contained HTML file (plots as inline SVG, no network)
and a Markdown twin, built from the same payload ``lcmoe plan --json`` prints."""
