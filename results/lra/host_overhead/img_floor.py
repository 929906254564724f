"""Floor of the LRA Image step: the same model and optimizer in a bare loop (no Lightning, batches already on
the GPU), standard vs flash; then the same with the task's DataLoader. Prints ms/step."""
import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, ".")
from hydra import compose, initialize_config_dir
from train.config import register_resolvers
register_resolvers()
import os
from train.run import build
res = {}
for attn, workers in (("standard", 4), ("flash", 4), ("flash", 0)):
    with initialize_config_dir(config_dir=os.path.abspath("configs"), version_base=None):
        overrides = ["experiment=lra/image", f"attn={attn}", f"data.num_workers={workers}", "~logger", "~callbacks",
                     "hydra.run.dir=/tmp/floor", "data.data_dir=${repo:}/data/cache/lra-speed/image",
                     "trainer.max_steps=400"]
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        from hydra.core.hydra_config import HydraConfig; HydraConfig.instance().set_config(cfg)
    dm, task, trainer = build(cfg)
    model = task.model.cuda()
    opt = task.configure_optimizers()
    opt = opt["optimizer"] if isinstance(opt, dict) else opt
    dm.setup()
    loader = dm.train_dataloader()
    it = iter(loader)
    batches = [dm.on_after_batch_transfer({k: v.cuda() for k, v in next(it).items()}, 0) for _ in range(8)]
    def step(b):
        with torch.autocast("cuda", torch.bfloat16):
            logits = model(input_ids=b["input_ids"])
        loss = F.cross_entropy(logits.float(), b["labels"])
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    for i in range(30): step(batches[i % 8])
    torch.cuda.synchronize(); t = time.perf_counter()
    for i in range(200): step(batches[i % 8])
    torch.cuda.synchronize(); res[(attn, f"bare, data on GPU, w{workers}")] = (time.perf_counter() - t) / 200 * 1e3
    t = time.perf_counter()
    for i in range(200): step(dm.on_after_batch_transfer({k: v.cuda(non_blocking=True) for k, v in next(it).items()}, 0))
    torch.cuda.synchronize(); res[(attn, f"bare + DataLoader ({workers} workers)")] = (time.perf_counter() - t) / 200 * 1e3
    # host time alone: the same step on tiny shapes is not possible, so time the host side by syncing never
    # and measuring the time to enqueue 200 steps after the GPU has drained
    torch.cuda.synchronize(); t = time.perf_counter()
    for i in range(50): step(batches[i % 8])
    enq = (time.perf_counter() - t) / 50 * 1e3; torch.cuda.synchronize()
    res[(attn, f"enqueue time per step (host) w{workers}")] = enq
for k, v in res.items(): print(f"{k[0]:>9} | {k[1]:<32} | {v:6.2f} ms")
