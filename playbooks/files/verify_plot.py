# -*- coding: utf-8 -*-
# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""verify.yml's memory plot: a PNG of /proc/meminfo figures across the stability rounds, written
with the standard library (zlib) on the controller, so that no plotting package is needed.

Usage: verify_plot.py REPORT.json OUT.png. One line per figure, its colour in LEGEND (also written
into the report by verify.yml); the grey band is the band check's width above the first round's
used memory; x: rounds, y: GiB from 0 to the largest figure plotted.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import struct
import sys
import zlib

LEGEND = {"used (MemTotal - MemAvailable)": (0, 0, 0), "MemAvailable": (31, 119, 180), "MemFree": (44, 160, 44),
          "Cached": (255, 127, 14), "AnonPages": (214, 39, 40)}
WIDTH, HEIGHT, MARGIN = 640, 360, 30


def png(width, height, pixels):
    """pixels: bytearray of RGB rows -> PNG bytes."""
    raw = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


class Canvas(object):
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x, y, colour):
        for dx in (0, 1):
            for dy in (0, 1):
                px, py = int(x) + dx, int(y) + dy
                if 0 <= px < self.width and 0 <= py < self.height:
                    self.pixels[(py * self.width + px) * 3:(py * self.width + px) * 3 + 3] = bytes(colour)

    def line(self, x0, y0, x1, y1, colour):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for i in range(steps + 1):
            self.dot(x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps, colour)

    def fill(self, x0, y0, x1, y1, colour):
        for y in range(int(min(y0, y1)), int(max(y0, y1)) + 1):
            for x in range(int(x0), int(x1) + 1):
                if 0 <= x < self.width and 0 <= y < self.height:
                    self.pixels[(y * self.width + x) * 3:(y * self.width + x) * 3 + 3] = bytes(colour)


def series(report):
    rounds = report["load"]["rounds"]
    out = {}
    for name in LEGEND:
        if name.startswith("used"):
            out[name] = [r["meminfo_gib"]["MemTotal"] - r["meminfo_gib"]["MemAvailable"] for r in rounds]
        else:
            out[name] = [r["meminfo_gib"].get(name, 0.0) for r in rounds]
    return out


def plot(report):
    data = series(report)
    canvas = Canvas(WIDTH, HEIGHT)
    top = max([v for values in data.values() for v in values] + [1e-6]) * 1.05
    count = max(len(v) for v in data.values()) if data else 0

    def xy(index, value):
        x = MARGIN + (WIDTH - 2 * MARGIN) * (index / max(1, count - 1))
        return x, HEIGHT - MARGIN - (HEIGHT - 2 * MARGIN) * (value / top)
    used = data["used (MemTotal - MemAvailable)"]
    if used:
        band = report["load"].get("band", {}).get("band_gib", 0.0)
        _x, y0 = xy(0, used[0])
        _x, y1 = xy(0, used[0] + band)
        canvas.fill(MARGIN, y0, WIDTH - MARGIN, y1, (225, 225, 225))
    canvas.line(MARGIN, MARGIN, MARGIN, HEIGHT - MARGIN, (90, 90, 90))
    canvas.line(MARGIN, HEIGHT - MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN, (90, 90, 90))
    for index in range(count):
        x, _y = xy(index, 0)
        canvas.line(x, HEIGHT - MARGIN, x, HEIGHT - MARGIN + 5, (90, 90, 90))
    for name, values in data.items():
        points = [xy(i, v) for i, v in enumerate(values)]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            canvas.line(x0, y0, x1, y1, LEGEND[name])
        for x, y in points:
            canvas.fill(x - 2, y - 2, x + 2, y + 2, LEGEND[name])
    return png(WIDTH, HEIGHT, canvas.pixels)


def main():
    with open(sys.argv[1]) as handle:
        report = json.load(handle)
    with open(sys.argv[2] + ".tmp", "wb") as handle:
        handle.write(plot(report))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    print(json.dumps({"png": sys.argv[2], "legend": dict((k, "#%02x%02x%02x" % v) for k, v in LEGEND.items())}))


if __name__ == "__main__":
    main()
