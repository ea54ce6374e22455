"""A report's files (OUT/STEM.md, the chart's data) and its clustered bar chart (gnuplot)."""

import os
import subprocess


def write_report(out, stem, lines, chart_data):
    """A report's files: OUT/STEM.md, and OUT/STEM.dat for its chart when it has data for one; the report is printed
    too."""
    with open(os.path.join(out, stem + ".md"), "w") as f:
        f.write("\n".join(lines))
    if chart_data:
        with open(os.path.join(out, stem + ".dat"), "w") as f:
            f.write(chart_data)
    print("\n".join(lines))


def draw_chart(dat, png, title, ylabel):
    """A clustered bar chart (gnuplot, pngcairo) of a report's data file: a header line naming the columns, then one
    row per job (its name, then one value per column)."""
    with open(dat) as f:
        columns = len(f.readline().rstrip("\n").split("\t"))
    script = f"""set terminal pngcairo size 1100,520 noenhanced font ",10"
set output "{png}"
set title "{title}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel "{ylabel}"
set yrange [0:*]
set grid ytics
set xtics rotate by -30
set rmargin 9
set key top left
set datafile separator "\\t"
set key autotitle columnhead
plot for [c=2:{columns}] "{dat}" using c:xtic(1)
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=120)
