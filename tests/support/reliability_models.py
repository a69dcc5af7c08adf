"""Small models the reliability tests share: token ids through an embedding (a gather
whose indices are checked at run time), layer norm, attention with a mask, a linear."""

import torch


class TinyEncoder(torch.nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm = torch.nn.LayerNorm(d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, ids, mask):
        h = self.norm(self.emb(ids))
        scores = h @ h.transpose(1, 2) * 0.25 + (1.0 - mask[:, None, :]) * -1e4
        return self.proj(torch.softmax(scores, dim=-1) @ h)


def encoder_inputs(b: int, s: int, seed: int = 0, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, s), generator=g)
    mask = torch.ones(b, s)
    mask[:, s - s // 3 :] = 0.0
    return ids, mask


def compile_encoder():
    import symfuse

    ids, mask = encoder_inputs(2, 8)
    model = TinyEncoder().eval()
    dyn = {"ids": {0: "B", 1: "S"}, "mask": {0: "B", 1: "S"}}
    return model, symfuse.compile(model, (ids, mask), dyn)
