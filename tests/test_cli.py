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
    opaque = "max_pool2d x1, avg_pool2d x1, adaptive_avg_pool2d x1"
    assert f"no TE lowering yet, run through torch: {opaque}" in out
    # the batch norm folded into the convolution, whose ReLU is its post-op
    assert "relu[i0, i1, i2, i3] = relu(conv2d[i0, i1, i2, i3])   for i0 < B" in out
    assert "oneDNN convolution; relu fused (oneDNN post-op)" in out
