"""The &model group of a kdtrain model card (mod/*.nml), for the perf scripts."""
import re


def read_card(path):
    """The &model group of a kdtrain card as a dict (ints, floats, bools, strings)."""
    text = open(path).read()
    text = "\n".join(line.split("!", 1)[0] for line in text.splitlines())
    card = {}
    for key, val in re.findall(r"(\w+)\s*=\s*('[^']*'|[^\s,/]+)", text):
        v = val.strip()
        if v.startswith("'"):
            card[key] = v.strip("'")
        elif v.lower() in (".true.", ".false."):
            card[key] = v.lower() == ".true."
        elif re.fullmatch(r"[-+]?\d+", v):
            card[key] = int(v)
        else:
            card[key] = float(v.lower().replace("d", "e"))
    return card
