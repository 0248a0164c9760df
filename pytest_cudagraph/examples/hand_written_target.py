import torch

from pytest_cudagraph.conformance import Cache, graphs_on, hand_written
from pytest_cudagraph.examples.encoder_cache import EncoderGraphCache, make_encoder  # yours

KEYS = [(batch, seq) for batch in range(1, 9) for seq in (16, 32, 48, 64, 80)]


def make_target(device, cache_class=EncoderGraphCache):
    encoder = make_encoder(device)

    def draw(generator, case):
        x = torch.randn(*case.key, 64, generator=generator, device=device)
        return {"x": x, "gain": 0.5 + torch.rand(64, generator=generator, device=device)}

    common = dict(
        device=device,
        eager=lambda inputs: encoder(inputs["x"] * inputs["gain"]),
        keys=KEYS,
        draw=draw,
        key_of=lambda inputs: tuple(inputs["x"].shape[:2]),
    )
    if not graphs_on(device):  # no CUDA, graphs not emulated: the dry run of eager alone
        return hand_written(graphed=None, **common)
    cache = cache_class(encoder, device)
    stages = ("warm_up", "capture", "replay", "copy_out")  # its own methods, to inject faults in
    return hand_written(
        graphed=lambda inputs: cache(**inputs),
        cache=Cache(
            reset=cache.clear,
            lock=cache.lock,
            capacity=cache.capacity,
            largest_key=max(KEYS),
            cached_keys=lambda: list(cache.graphs),
            fault_points={stage: (cache, stage) for stage in stages},
        ),
        **common,
    )
