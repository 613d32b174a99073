"""A deterministic local embedding for the store's semantic search (no model, no network): words
hashed into 256 dimensions and normalised, so texts that share words are near each other."""

import hashlib
import math
import re

DIMS = 256


def embed(texts: list[str]) -> list[list[float]]:
    vectors = []
    for text in texts:
        vector = [0.0] * DIMS
        for word in re.findall(r"[\w@.-]+", text.lower()):
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMS] += 1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        vectors.append([v / norm for v in vector])
    return vectors
