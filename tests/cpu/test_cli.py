from symfuse.cli import main


def test_models_lists_builtins(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out.split()
    assert {"bert-base", "bert-small", "gpt2", "vit-base", "t5-encoder-small", "resnet", "lstm"} <= set(out)


def test_explain_command_shows_symbols_classes_and_checks(capsys):
    assert main(["explain", "--model", "resnet"]) == 0
    out = capsys.readouterr().out
    # the average pool needs a window of at least one pixel: H >= 6
    assert "H in [6, inf] bound by input 'x' dim 2, input 'x' dim 3  <- the pooling/convolution window fits" in out
    assert "32*B*(H//2)**2" in out
    assert "equal element counts" in out and "checked on every call" in out
    assert "%conv2d: f32[B, 32, H, H]" in out  # padding 1 keeps the side
    assert "(H - 1)//2 + 1" in out or "(H + 1)//2" in out or "H//2" in out


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["explain", "--model", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


def test_explain_lists_tensor_expressions(capsys):
    assert main(["explain", "--model", "resnet", "--no-graph", "--te"]) == 0
    out = capsys.readouterr().out
    assert "tensor expressions (layout ops composed into loads):" in out
    assert "no TE lowering yet" not in out  # pools are reductions over their windows
    window = "r0_max_pool2d < 2, r1_max_pool2d < 2)   for i0 < B, i1 < 32, i2 < H//2, i3 < H//2"
    assert (
        f"max_pool2d[i0, i1, i2, i3] = max(relu[i0, i1, 2*i2 + r0_max_pool2d, 2*i3 + r1_max_pool2d] for {window}" in out
    )
    # the batch norm folded into the convolution, whose ReLU is its post-op
    assert "relu[i0, i1, i2, i3] = relu(conv2d[i0, i1, i2, i3])   for i0 < B" in out
    assert "oneDNN convolution; relu fused (oneDNN post-op)" in out


def _onnx_file(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as oh
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    g = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["h"]), oh.make_node("Relu", ["h"], ["y"])],
        "tiny",
        [oh.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", 4])],
        [oh.make_tensor_value_info("y", TP.FLOAT, ["batch", "seq", 3])],
        [w],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)]), path)
    return str(path)


def test_onnx_compile_run_with_npy_inputs_and_explain(tmp_path, capsys):
    import numpy as np

    path = _onnx_file(tmp_path)
    out_dir = str(tmp_path / "art")
    assert main(["compile", path, "--dynamic", "x:0=B,1=S", "-o", out_dir]) == 0
    assert "run it: symfuse run" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", np.ones((2, 5, 4), np.float32))
    assert main(["run", out_dir, "--input", f"x={tmp_path / 'x.npy'}", "--shape", "B=1,S=3"]) == 0
    out = capsys.readouterr().out
    assert "B=2, S=5" in out and "(2, 5, 3)" in out and "B=1, S=3" in out and "(1, 3, 3)" in out
    assert main(["explain", path, "--no-graph"]) == 0
    out = capsys.readouterr().out
    assert "imported from ONNX" in out and "batch in [1, inf]" in out


def test_onnx_cli_mistakes_are_one_line_errors(tmp_path, capsys):
    path = _onnx_file(tmp_path)
    assert main(["compile", path, "--dynamic", "x0=B", "-o", str(tmp_path / "a")]) == 2
    assert "expected INPUT:DIM=NAME" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "missing.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compile", path, "-o", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "a"), "--input", "y=nothing.npy"]) == 2
    assert "the module's inputs are x" in capsys.readouterr().err


def test_demo_prints_a_table_and_makes_its_plot(tmp_path, capsys):
    """What the README promises of `bash scripts/demo.sh`: a short table, no log lines, and
    the plot in the output folder."""
    assert main(["demo", "--model", "bert-small", "--reps", "1", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "binding" in out and "compilations during the sweep: 0" in out and "symfuse:" not in err
    assert (tmp_path / "latency.png").stat().st_size > 1000 and f"plot: {tmp_path}" in out


def test_tune_measures_the_switch_points_a_model_needs_and_later_compiles_use_them(tmp_path, capsys, monkeypatch):
    import torch

    import symfuse

    monkeypatch.setenv("SYMFUSE_MACHINE_DIR", str(tmp_path / "machine"))
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU())
    path = str(tmp_path / "linear.onnx")
    torch.onnx.export(model, (torch.randn(3, 64),), path, input_names=["x"], dynamic_axes={"x": {0: "M"}}, dynamo=False)
    assert main(["tune", path]) == 0
    out = capsys.readouterr().out
    assert "linear_rows" in out and "64x96" in out and "kept in the machine folder" in out
    c = symfuse.compile(path)
    sources = {th.kind: th.source for th in c.native.thresholds.values()}
    assert sources and all("measured on this machine" in s for s in sources.values()), sources
