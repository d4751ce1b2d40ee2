"""The shared GNN behaviour of SAGE and GIN: one forward for blocks and for full graphs."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from gnnaas.errors import ConfigError
from gnnaas.models import GIN, GNN, SAGE, Arch, build_model
from gnnaas.sampling import Block, NeighborSampler

ARCHS = ["sage", "gin"]

# a tiny directed graph (row 0 source, row 1 target): a 6-cycle, two chords and a pendant node 6
EDGE_INDEX = torch.tensor(
    [
        [0, 1, 2, 3, 4, 5, 1, 2, 3, 0, 4, 6, 2],
        [1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 1, 2, 6],
    ]
)
NUM_NODES = 7
IN, HIDDEN, OUT = 5, 8, 3


def _full_blocks(edge_index: Tensor, seeds: Tensor, num_layers: int) -> tuple[Tensor, list[Block]]:
    """Every in-neighbor of every node, hop by hop: the blocks of a fanout -1 sample."""
    n_id = seeds.clone()
    hops: list[tuple[Tensor, Tensor, tuple[int, int]]] = []
    for _ in range(num_layers):
        num_dst = n_id.numel()
        src, dst = edge_index[:, torch.isin(edge_index[1], n_id)]
        n_id = torch.cat([n_id, torch.unique(src[~torch.isin(src, n_id)])])
        hops.append((src, dst, (n_id.numel(), num_dst)))
    local = torch.full((NUM_NODES,), -1, dtype=torch.int64)
    local[n_id] = torch.arange(n_id.numel())
    blocks = [Block(torch.stack([local[src], local[dst]]), size) for src, dst, size in hops]
    return n_id, blocks[::-1]  # forward order: outermost hop first


def _model(arch: str, num_layers: int = 2) -> GNN:
    torch.manual_seed(0)
    return build_model(arch, IN, HIDDEN, OUT, num_layers=num_layers, dropout=0.5)


def _check_shape(out: Tensor, rows: int) -> None:
    assert out.shape == (rows, OUT)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("seeds", [[0], [2, 5, 6]])
def test_blocks_output_one_row_per_seed(arch: str, num_layers: int, seeds: list[int]) -> None:
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor(seeds), num_layers)
    model = _model(arch, num_layers).eval()
    x = torch.randn(n_id.numel(), IN)
    _check_shape(model(x, blocks), len(seeds))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_full_graph_output_one_row_per_node(arch: str, num_layers: int) -> None:
    model = _model(arch, num_layers).eval()
    _check_shape(model(torch.randn(NUM_NODES, IN), EDGE_INDEX), NUM_NODES)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("seeds", [[0], [3, 1], [6, 0, 4, 2]])
def test_full_neighborhood_blocks_match_full_graph(
    arch: str, num_layers: int, seeds: list[int]
) -> None:
    model = _model(arch, num_layers)
    with torch.no_grad():  # non-trivial batch-norm statistics, used in eval mode
        for buf in model.buffers():
            if buf.dtype.is_floating_point:
                buf.uniform_(0.5, 1.5)
    model.eval()
    x = torch.randn(NUM_NODES, IN)
    seed_ids = torch.tensor(seeds)
    n_id, blocks = _full_blocks(EDGE_INDEX, seed_ids, num_layers)
    full = model(x, EDGE_INDEX)[seed_ids]
    sampled = model(x[n_id], blocks)
    torch.testing.assert_close(sampled, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_sampler_blocks_with_all_neighbors_match_full_graph(arch: str) -> None:
    # CSR over incoming edges: the in-neighbors of i are col[rowptr[i]:rowptr[i + 1]]
    order = torch.argsort(EDGE_INDEX[1], stable=True)
    col = EDGE_INDEX[0, order]
    rowptr = torch.zeros(NUM_NODES + 1, dtype=torch.int64)
    rowptr[1:] = torch.bincount(EDGE_INDEX[1], minlength=NUM_NODES).cumsum(0)
    sampler = NeighborSampler(rowptr, col, (-1, -1))
    model = _model(arch).eval()
    x = torch.randn(NUM_NODES, IN)
    seeds = torch.tensor([4, 0, 6])
    sub = sampler.sample(seeds, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        model(x[sub.n_id], sub.blocks), model(x, EDGE_INDEX)[seeds], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "pyg"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_embedding_is_the_input_of_the_last_convolution(
    arch: str, num_layers: int, fused: bool
) -> None:
    model = _model(arch, num_layers).eval()
    seen: list[Tensor] = []
    model.convs[-1].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    width = HIDDEN if num_layers > 1 else IN  # a one-layer model embeds its input features
    x = torch.randn(NUM_NODES, IN)
    with torch.inference_mode():
        embedding, logits = model(x, EDGE_INDEX, embed=True)
        assert embedding.shape == (NUM_NODES, width)
        torch.testing.assert_close(embedding, seen[-1])
        torch.testing.assert_close(logits, model(x, EDGE_INDEX))
        seeds = torch.tensor([3, 1])
        n_id, blocks = _full_blocks(EDGE_INDEX, seeds, num_layers)
        embedding, logits = model(x[n_id], blocks, embed=True, pyg_convs=not fused)
    assert embedding.shape == (2, width)
    _check_shape(logits, 2)
    if num_layers > 1:
        assert (embedding >= 0).all()  # after the previous layer's ReLU
    else:
        torch.testing.assert_close(embedding, x[seeds])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_full_fanout_embeddings_match_the_full_graph(arch: str, num_layers: int) -> None:
    # the sampled forward with every neighbor computes the full-graph embeddings
    order = torch.argsort(EDGE_INDEX[1], stable=True)
    col = EDGE_INDEX[0, order]
    rowptr = torch.zeros(NUM_NODES + 1, dtype=torch.int64)
    rowptr[1:] = torch.bincount(EDGE_INDEX[1], minlength=NUM_NODES).cumsum(0)
    sampler = NeighborSampler(rowptr, col, (-1,) * num_layers)
    model = _model(arch, num_layers).eval()
    x = torch.randn(NUM_NODES, IN)
    seeds = torch.tensor([4, 0, 6])
    sub = sampler.sample(seeds, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        sampled, _ = model(x[sub.n_id], sub.blocks, embed=True)
        full, _ = model(x, EDGE_INDEX, embed=True)
    torch.testing.assert_close(sampled, full[seeds], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sparse", [False, True], ids=["index_add", "csr"])
@pytest.mark.parametrize("family", ["gnnaas", "pyg"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_fused_eval_layers_compute_the_pyg_convolutions(
    family: str, arch: str, num_layers: int, sparse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gnnaas.models.base as base

    # Every block through the sparse product (large blocks) or none (a served request's).
    monkeypatch.setattr(base, "SPARSE_MIN_ELEMENTS", 0 if sparse else 1 << 60)
    torch.manual_seed(1)
    model = build_model(arch, IN, HIDDEN, OUT, num_layers=num_layers, family=family).eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        for buf in model.buffers():
            if buf.dtype.is_floating_point:
                buf.uniform_(0.5, 1.5)
    # Random blocks with repeated edges and targets that have no neighbor at all.
    sizes = [40, 25, 9, 3][-(num_layers + 1) :]
    blocks = []
    for num_src, num_dst in zip(sizes, sizes[1:], strict=False):
        dst = torch.randint(0, num_dst - 1, (3 * num_src,))  # the last target: no edge
        blocks.append(
            Block(torch.stack([torch.randint(0, num_src, dst.shape), dst]), (num_src, num_dst))
        )
    x = torch.randn(sizes[0], IN)
    with torch.inference_mode():
        fused_emb, fused = model(x, blocks, embed=True)
        convs_emb, convs = model(x, blocks, embed=True, pyg_convs=True)
    assert fused.shape == (sizes[-1], OUT)
    torch.testing.assert_close(fused, convs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_emb, convs_emb, rtol=1e-5, atol=1e-5)
    assert not torch.equal(fused[-1], torch.zeros(OUT))  # the root term still counts


@pytest.mark.parametrize("arch", ARCHS)
def test_training_and_full_graphs_never_take_the_fused_layers(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(arch)

    def refuse(*_: object) -> None:
        raise AssertionError("fused_layer called")

    monkeypatch.setattr(model, "fused_layer", refuse)
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor([0, 1]), 2)
    model.train()(torch.randn(n_id.numel(), IN), blocks)
    model.eval()(torch.randn(NUM_NODES, IN), EDGE_INDEX)


@pytest.mark.parametrize("arch", ARCHS)
def test_eval_on_blocks_takes_the_fused_layers_unless_pyg_is_asked(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(arch).eval()
    layers: list[int] = []
    fused_layer = model.fused_layer

    def counted(layer: int, x: Tensor, block: Block) -> Tensor | None:
        layers.append(layer)
        return fused_layer(layer, x, block)

    monkeypatch.setattr(model, "fused_layer", counted)
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor([0, 1]), 2)
    x = torch.randn(n_id.numel(), IN)
    model(x, blocks)
    assert layers == [0, 1]
    model(x, blocks, pyg_convs=True)
    assert layers == [0, 1]
    # A scaled sum (a GIN sampled with more neighbors than trained) exists in the fused layers only.
    model.train_fanouts = (1, 1)
    model.configure_fanouts((-1, -1))
    model(x, blocks, pyg_convs=True)
    assert layers == ([0, 1, 0, 1] if arch == "gin" else [0, 1])


@pytest.mark.parametrize("arch", ARCHS)
def test_a_block_without_edges_keeps_the_root_term(arch: str) -> None:
    model = _model(arch, 1).eval()
    block = Block(torch.empty((2, 0), dtype=torch.int64), (4, 2))
    x = torch.randn(4, IN)
    fused = model(x, [block])
    torch.testing.assert_close(fused, model(x, [block], pyg_convs=True), rtol=1e-5, atol=1e-5)


def test_a_gin_that_does_not_sum_runs_through_pyg() -> None:
    from torch_geometric.nn import GINConv

    model = _model("gin", 1).eval()
    conv = model.convs[0]
    model.convs[0] = GINConv(conv.nn, aggr="mean")
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor([0, 1]), 1)
    assert model.fused_layer(0, torch.randn(n_id.numel(), IN), blocks[0]) is None


def test_a_sage_layout_the_fused_layer_does_not_compute_runs_through_pyg() -> None:
    from torch_geometric.nn import SAGEConv

    model = _model("sage", 1).eval()
    model.convs[0] = SAGEConv(IN, OUT, aggr="mean", normalize=True)
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor([0, 1]), 1)
    assert model.fused_layer(0, torch.randn(n_id.numel(), IN), blocks[0]) is None
    out = model(torch.randn(n_id.numel(), IN), blocks)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(2))  # normalized by PyG's conv


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_reach_the_first_layer(arch: str) -> None:
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor([0, 1, 2]), 2)
    model = _model(arch).train()
    out = model(torch.randn(n_id.numel(), IN), blocks)
    torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2])).backward()
    for weight in model.first_layer_weights():
        assert weight.grad is not None and weight.grad.abs().sum() > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_dropout_only_in_training(arch: str) -> None:
    model = _model(arch)
    x = torch.randn(NUM_NODES, IN)
    model.eval()
    torch.testing.assert_close(model(x, EDGE_INDEX), model(x, EDGE_INDEX))
    model.train()
    assert not torch.allclose(model(x, EDGE_INDEX), model(x, EDGE_INDEX))


@pytest.mark.parametrize("arch", ARCHS)
def test_wrong_number_of_blocks(arch: str) -> None:
    n_id, blocks = _full_blocks(EDGE_INDEX, torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="expects 2 blocks \\(got 1\\)"):
        _model(arch)(torch.randn(n_id.numel(), IN), blocks)


@pytest.mark.parametrize("arch", ARCHS)
def test_first_layer_weights_multiply_the_input(arch: str) -> None:
    model = _model(arch)
    weights = model.first_layer_weights()
    assert len(weights) == (2 if arch == "sage" else 1)
    params = {id(p) for p in model.convs[0].parameters()}
    for w in weights:
        assert w.shape == (HIDDEN, IN)
        assert id(w) in params


@pytest.mark.parametrize(
    ("name", "cls"), [("sage", SAGE), ("SAGE", SAGE), (" Gin ", GIN), (Arch.GIN, GIN)]
)
def test_build_model_accepts_names_in_any_case(name: str, cls: type[GNN]) -> None:
    model = build_model(name, IN, HIDDEN, OUT)
    assert type(model) is cls
    assert model.arch is Arch.parse(name)
    assert (model.in_channels, model.hidden_channels, model.out_channels) == (IN, HIDDEN, OUT)


def test_build_model_unknown_arch() -> None:
    with pytest.raises(ConfigError, match="unknown arch 'x'; choose sage or gin"):
        build_model("x", IN, HIDDEN, OUT)
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_channels": 0}, "in_channels to be an integer >= 1 \\(got 0\\)"),
        ({"num_layers": 0}, "num_layers to be an integer >= 1 \\(got 0\\)"),
        ({"dropout": 1.0}, "dropout in \\[0, 1\\) \\(got 1.0\\)"),
    ],
)
def test_bad_dims(arch: str, kwargs: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"in_channels": IN, "hidden_channels": HIDDEN, "out_channels": OUT}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build_model(arch, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("arch", "name"), [("sage", "SAGE"), ("gin", "GIN")])
def test_repr(arch: str, name: str) -> None:
    model = build_model(arch, 1433, 256, 7, num_layers=2, dropout=0.5)
    assert repr(model) == f"{name}(1433, 256, 7, num_layers=2, dropout=0.5)"
