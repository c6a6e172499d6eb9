"""Write docs/schema/*.schema.json: the JSON Schema of each main ``--json`` document, generated
from the pydantic models in ``lcmoe.cli.json_models`` (the source of truth).

    python tools/gen_json_schema.py            # (re)write the files
    python tools/gen_json_schema.py --check    # exit 1 if a shipped file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "schema"


def rendered() -> dict[str, str]:
    """file name → the text it should hold."""
    from lcmoe.cli.json_models import DOCUMENTS, json_schema

    return {name: json.dumps(json_schema(model), indent=2, sort_keys=False) + "\n" for name, model in DOCUMENTS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        OUT.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run python tools/gen_json_schema.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
