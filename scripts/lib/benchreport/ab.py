"""The one A/B rule of every report: medians over rounds, or the rounds paired; ours/baseline below SLOW in **bold**,
the worst row named."""

import statistics


SLOW = 0.95  # an A/B row whose ours/baseline is below this is flagged; the noise of one run is about 5 %


def ab_ratio(ours, other, baseline):
    """The text of a ratio cell and the ratio; bold when the other side is the baseline and ours is slower by more
    than the noise; "-" when either side failed."""
    if not (ours and other):
        return "-", None
    x = ours / other
    return (f"**{x:.2f}**" if baseline and x < SLOW else f"{x:.2f}"), x


def ab_columns(v, ratios, with_paired, paired_x, name, ab_rows):
    """A row's ratio cells: ours against each of ratios (v: name -> value), then the paired ratio when the run has
    one. Appends to ab_rows the (ratio, name) the verdict reads: the paired one when there is a paired column, else
    ours/baseline."""
    cells = []
    for r in ratios:
        text, x = ab_ratio(v["ours"], v[r], r == "baseline" and not with_paired)
        cells.append(text)
        if r == "baseline" and x is not None and not with_paired:
            ab_rows.append((x, name))
    if with_paired:
        cells.append("-" if paired_x is None else (f"**{paired_x:.2f}**" if paired_x < SLOW else f"{paired_x:.2f}"))
        if paired_x is not None:
            ab_rows.append((paired_x, name))
    return cells


def ab_summary(rows, what):
    """The A/B verdict line: how many rows, the worst one, how many below the threshold. rows: (ratio, name)."""
    if not rows:
        return f"A/B: 0 rows (every {what} failed on ours or the baseline)."
    worst = min(rows)
    slow = sum(1 for x, _ in rows if x < SLOW)
    return f"A/B: {len(rows)} rows, worst ours/baseline {worst[0]:.2f} ({worst[1]}); {slow} row(s) below {SLOW}."


def ab_note(ours_desc, base_desc, alternated):
    return (f"ours = {ours_desc}; baseline = {base_desc}. Even rounds ran the {alternated} in reverse order; "
            f"ours/baseline below {SLOW} is **bold**.")


def paired_ratios(rounds, value, ours_name="ours", base_name="baseline"):
    """An A/B run's paired estimate: rounds[(row, prog)] -> {round: measurement}; for each row, the median over the
    rounds both sides completed of ours/baseline within the round (the two ran back to back, so what the machine
    did that minute weighs on both), or no entry when no round has both. value(row, measurement) -> the figure
    compared. ours_name and base_name: the two progs compared."""
    paired = {}
    for (row, prog), ours in rounds.items():
        if prog != ours_name:
            continue
        base = rounds.get((row, base_name), {})
        xs = [value(row, ours[r]) / value(row, base[r]) for r in ours if r in base and value(row, base[r])]
        if xs:
            paired[row] = statistics.median(xs)
    return paired


def paired_note():
    return ("paired = the median over rounds of ours/baseline within a round (the two ran back to back); the"
            " verdict reads it, the ratio of the medians beside it is the same figures reduced the other way.")
