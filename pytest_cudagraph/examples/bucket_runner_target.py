import torch

from pytest_cudagraph.conformance import Cache, Tolerance, graphs_on, hand_written
from pytest_cudagraph.examples import bucket_runner as vllm  # nano-vllm's runner, cut down


def make_target(device, runner_class=vllm.BucketRunner):
    model = vllm.make_model(device)
    runner = runner_class(model, device) if graphs_on(device) else None  # CUDA, or emulated

    def draw(generator, case):  # a real batch inside the bucket, its size from case.repeat
        rows = case.key // 2 + 1 + case.repeat % (case.key - case.key // 2)
        tokens = torch.randint(vllm.VOCAB, (rows,), generator=generator, device=device)
        positions = torch.randint(vllm.MAX_POSITION, (rows,), generator=generator, device=device)
        return {"input_ids": tokens, "positions": positions}

    return hand_written(
        device=device,
        eager=lambda inputs: model(**inputs),
        graphed=runner and (lambda inputs: runner.run(**inputs)),
        keys=vllm.BUCKETS,
        draw=draw,
        key_of=lambda inputs: next(b for b in vllm.BUCKETS if b >= len(inputs["input_ids"])),
        cache=Cache(capacity=len(vllm.BUCKETS), largest_key=vllm.BUCKETS[-1]),  # all at start-up
        output_lifetime="next call",  # one static output buffer for every bucket
        threads="single",
        tolerance=Tolerance(atol=1e-5, rtol=1e-4),  # a padded bucket runs matmuls of its size
    )
