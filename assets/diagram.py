"""Render a box-and-arrow diagram from its text description (``assets/architecture.txt``) with
matplotlib: the picture is regenerated from a reviewed text file, never edited by hand.

The format is described at the top of ``architecture.txt``. Usage::

    python assets/diagram.py assets/architecture.txt assets/architecture.png
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

STYLES = {  # face, edge
    "user": ("#f3e8ff", "#8250df"),
    "core": ("#dafbe1", "#1a7f37"),
    "server": ("#ddf4ff", "#0969da"),
    "data": ("#f6f8fa", "#57606a"),
    "trainer": ("#fff1e5", "#bc4c00"),
}
LINE_HEIGHT = 0.25
"""Height of one label line, in diagram units."""


@dataclass
class Box:
    id: str
    x: float
    y: float
    width: float
    style: str
    lines: list[str]

    @property
    def height(self) -> float:
        return LINE_HEIGHT * len(self.lines) + 0.3

    def edge_towards(self, px: float, py: float) -> tuple[float, float]:
        """Where the segment from the centre towards ``(px, py)`` leaves the box."""
        dx, dy = px - self.x, py - self.y
        if dx == 0 and dy == 0:
            return self.x, self.y
        scale = min(
            (self.width / 2) / abs(dx) if dx else float("inf"),
            (self.height / 2) / abs(dy) if dy else float("inf"),
        )
        return self.x + dx * scale, self.y + dy * scale


@dataclass
class Arrow:
    source: str
    target: str
    label: str = ""
    offset: float = 0.0
    via: float | None = None


@dataclass
class Diagram:
    title: str = ""
    boxes: dict[str, Box] = field(default_factory=dict)
    arrows: list[Arrow] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)


BOX = re.compile(r"box\s+(\S+)\s+([-\d.]+)\s+([-\d.]+)\s+([\d.]+)\s+(\w+)\s*:\s*(.*)")
ARROW = re.compile(r"(\S+)\s*->\s*(\S+)(?:\s+@([-\d.]+))?(?:\s+via\s+([-\d.]+))?\s*(?::\s*(.*))?")
LEGEND = re.compile(r"legend\s+(\w+)\s*:\s*(.*)")


def parse(text: str) -> Diagram:
    """The diagram described by ``text``; a line that is none of the forms is an error naming it."""
    diagram = Diagram()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("title "):
            diagram.title = line[6:].strip()
        elif m := BOX.fullmatch(line):
            box_id, x, y, width, style, label = m.groups()
            if style not in STYLES:
                raise ValueError(f"line {number}: unknown style {style!r} (known: {', '.join(STYLES)})")
            lines = [part.strip() for part in label.split("\\n")]
            diagram.boxes[box_id] = Box(box_id, float(x), float(y), float(width), style, lines)
        elif m := LEGEND.fullmatch(line):
            diagram.legend.append((m.group(1), m.group(2)))
        elif m := ARROW.fullmatch(line):
            source, target, offset, via, label = m.groups()
            route = None if via is None else float(via)
            diagram.arrows.append(Arrow(source, target, label or "", float(offset or 0), route))
        else:
            raise ValueError(f"line {number}: cannot read {line!r}")
    for arrow in diagram.arrows:
        for end in (arrow.source, arrow.target):
            if end not in diagram.boxes:
                raise ValueError(f"arrow {arrow.source} -> {arrow.target}: no box {end!r}")
    return diagram


def render(diagram: Diagram, out: str | Path, *, dpi: int = 110) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    boxes = diagram.boxes.values()
    left = min(b.x - b.width / 2 for b in boxes) - 0.3
    right = max(b.x + b.width / 2 for b in boxes) + 0.3
    top = min(b.y - b.height / 2 for b in boxes) - (0.7 if diagram.title else 0.3)
    bottom = max(b.y + b.height / 2 for b in boxes) + (0.6 if diagram.legend else 0.3)
    fig = plt.figure(figsize=(right - left, bottom - top), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(left, right)
    ax.set_ylim(bottom, top)
    ax.axis("off")
    if diagram.title:
        ax.text((left + right) / 2, top + 0.3, diagram.title, ha="center", va="center", fontsize=12, weight="bold")
    for b in boxes:
        face, edge = STYLES[b.style]
        ax.add_patch(FancyBboxPatch((b.x - b.width / 2, b.y - b.height / 2), b.width, b.height,
                                    boxstyle="round,pad=0,rounding_size=0.12", facecolor=face, edgecolor=edge,
                                    linewidth=1.4))  # fmt: skip
        first = b.y - (len(b.lines) - 1) * LINE_HEIGHT / 2
        for i, text in enumerate(b.lines):
            ax.text(b.x, first + i * LINE_HEIGHT, text, ha="center", va="center", fontsize=8.5 if i else 9.5,
                    weight="bold" if i == 0 else "normal", family="DejaVu Sans")  # fmt: skip
    style = {"arrowstyle": "-|>", "mutation_scale": 12, "color": "#424a53", "linewidth": 1.2}
    for a in diagram.arrows:
        src, dst = diagram.boxes[a.source], diagram.boxes[a.target]
        if a.via is not None:  # out sideways (below the centre, clear of arrows coming in), along x = via, in
            low = src.y + src.height / 4
            start = (src.x + (src.width / 2 if a.via > src.x else -src.width / 2), low)
            end = dst.edge_towards(a.via, dst.y)
            ax.plot([start[0], a.via, a.via], [start[1], start[1], end[1]], color=style["color"], linewidth=1.2)
            ax.add_patch(FancyArrowPatch((a.via, end[1]), end, **style))
            label_at = (a.via, (start[1] + end[1]) / 2)
        else:
            dx, dy = dst.x - src.x, dst.y - src.y
            norm = max((dx * dx + dy * dy) ** 0.5, 1e-9)
            ox, oy = -dy / norm * a.offset, dx / norm * a.offset
            start = src.edge_towards(dst.x + ox, dst.y + oy)
            end = dst.edge_towards(src.x + ox, src.y + oy)
            start, end = (start[0] + ox, start[1] + oy), (end[0] + ox, end[1] + oy)
            ax.add_patch(FancyArrowPatch(start, end, **style))
            label_at = ((start[0] + end[0]) / 2 + ox, (start[1] + end[1]) / 2 + oy)
        if a.label:
            ax.text(*label_at, a.label, ha="center", va="center", fontsize=7.5, color="#24292f",
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"})  # fmt: skip
    if diagram.legend:
        x = left + 0.4
        for key, text in diagram.legend:
            face, edge = STYLES[key]
            ax.add_patch(FancyBboxPatch((x, bottom - 0.42), 0.3, 0.2, boxstyle="round,pad=0,rounding_size=0.05",
                                        facecolor=face, edgecolor=edge))  # fmt: skip
            ax.text(x + 0.4, bottom - 0.32, text, va="center", fontsize=8)
            x += 0.6 + 0.075 * len(text) + 0.3
    out = Path(out)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("out")
    args = parser.parse_args()
    render(parse(Path(args.source).read_text(encoding="utf-8")), args.out)


if __name__ == "__main__":
    main()
