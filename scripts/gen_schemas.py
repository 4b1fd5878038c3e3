"""Regenerate spec/schemas/*.json from the protocol Structs."""

from __future__ import annotations

from pathlib import Path

from pisub.protocol.schema import SCHEMAS, render

OUT = Path(__file__).resolve().parents[1] / "spec" / "schemas"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in OUT.glob("*.json"):
        if stale.stem not in SCHEMAS:
            stale.unlink()
    for name in sorted(SCHEMAS):
        (OUT / f"{name}.json").write_text(render(name))
        print(f"wrote {OUT / name}.json")


if __name__ == "__main__":
    main()
