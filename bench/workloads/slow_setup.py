"""A text classifier whose data set is built slowly, as real ones are: a corpus tokenized
word by word in Python with a vocabulary built on the way (about 20 s on a 2-core VM),
before a small bag-of-embeddings model trains on it in milliseconds a step. Every fresh
process pays the setup again."""
import random

import torch
from torch import nn

batch_size = 64
WORDS, CLASSES, LENGTH, DOCUMENTS = 5_000, 8, 48, 240_000


def corpus(rng: random.Random) -> list[tuple[str, int]]:
    """Documents of made-up words whose class is carried by a few marker words."""
    lexicon = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
               for _ in range(WORDS)]
    markers = [lexicon[c * 7:(c + 1) * 7] for c in range(CLASSES)]
    documents = []
    for _ in range(DOCUMENTS):
        label = rng.randrange(CLASSES)
        words = [rng.choice(lexicon) for _ in range(LENGTH - 4)] + rng.sample(markers[label], 4)
        rng.shuffle(words)
        documents.append((" ".join(words), label))
    return documents


def tokenize(documents: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    vocabulary: dict[str, int] = {}
    rows, labels = [], []
    for text, label in documents:
        ids = [vocabulary.setdefault(word.lower().strip(".,;"), len(vocabulary)) for word in text.split()]
        rows.append(ids[:LENGTH] + [0] * (LENGTH - len(ids)))
        labels.append(label)
    return torch.tensor(rows), torch.tensor(labels)


class BagOfWords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(WORDS + 1, 64, mode="mean")
        self.head = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, CLASSES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def build_model() -> nn.Module:
    return BagOfWords()


def build_dataset() -> torch.utils.data.Dataset:
    # Three passes over the corpus, as a pipeline that normalises, filters and tokenizes does.
    documents = corpus(random.Random(0))
    for _ in range(2):
        documents = [(" ".join(w for w in text.split() if w), label) for text, label in documents]
    tokens, labels = tokenize(documents)
    return torch.utils.data.TensorDataset(tokens, labels)
