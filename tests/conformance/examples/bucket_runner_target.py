import torch

from examples.bucket_runner import BUCKETS, MAX_POSITION, VOCAB, BucketRunner, make_model
from pytest_cudagraph.conformance import Cache, Tolerance, hand_written


def make_target(device, runner_class=BucketRunner):
    model = make_model(device)
    runner = runner_class(model, device) if device.type == "cuda" else None  # graphs need CUDA

    def draw(generator, case):  # a real batch inside the bucket, its size from case.repeat
        rows = case.key // 2 + 1 + case.repeat % (case.key - case.key // 2)
        tokens = torch.randint(VOCAB, (rows,), generator=generator, device=device)
        positions = torch.randint(MAX_POSITION, (rows,), generator=generator, device=device)
        return {"input_ids": tokens, "positions": positions}

    return hand_written(
        device=device,
        eager=lambda inputs: model(**inputs),
        graphed=runner and (lambda inputs: runner.run(**inputs)),
        keys=BUCKETS,
        draw=draw,
        key_of=lambda inputs: next(b for b in BUCKETS if b >= len(inputs["input_ids"])),
        cache=Cache(capacity=len(BUCKETS), largest_key=BUCKETS[-1]),  # captured at start-up
        output_lifetime="next call",  # one static output buffer for every bucket
        threads="single",
        tolerance=Tolerance(atol=1e-5, rtol=1e-4),  # a padded bucket runs matmuls of its size
    )
