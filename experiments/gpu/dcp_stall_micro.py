# python3 experiments/gpu/dcp_stall_micro.py   (one GPU; torch >= 2.9; no Synapse import: it ran as an inline script)
"""Micro-benchmark behind bench_checkpoint_stall.py: dcp.async_save of a ResNet-152 state (weights,
buffers, SGD momentum: ~480 MB fp32) with a stager that copies into reused pinned buffers (what
synapse/engine/checkpointer.py does), 7 saves 3 s apart; stall = wait for the previous save + staging;
then one synchronous dcp.save, and a load with weights_only=True values checked equal.
Kept short (it was sent as one command line); result: experiments/results/h200/dcp_async_stall_micro.md."""
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torchvision
from torch.distributed.checkpoint import FileSystemWriter as W
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner as LP
from torch.distributed.checkpoint.staging import AsyncStager

warnings.simplefilter("ignore")
class S(AsyncStager):
  _synchronize_after_execute=False
  def __init__(s):s.b={}
  @property
  def should_synchronize_after_execute(s):return False
  def stage(s,sd,**k):
    o={}
    for n,v in sd.items():
      b=s.b.get(n)
      if b is None:
        b=torch.empty(v.shape,dtype=v.dtype,pin_memory=True)
      o[n]=b.copy_(v.detach(),non_blocking=True)
    s.b=o
    torch.cuda.current_stream().synchronize()
    return o
  def synchronize_staging(s):pass
m=torchvision.models.resnet152().cuda()
o=torch.optim.SGD(m.parameters(),lr=.1,momentum=.9)
m(torch.randn(8,3,224,224,device="cuda")).sum().backward()
o.step()
sd={"model/"+k:v for k,v in m.state_dict(keep_vars=True).items()}
sd.update({f"optim/{n}/momentum_buffer":o.state[p]["momentum_buffer"] for n,p in m.named_parameters()})
sg=S()
stall=[]
tot=[]
up=None
for k in range(7):
  torch.cuda.synchronize()
  t=time.perf_counter()
  if up:
    up.result()
  up=dcp.async_save(sd,storage_writer=W(f"/tmp/a{k}"),async_stager=sg,no_dist=True)
  stall.append(time.perf_counter()-t)
  time.sleep(3)
up.result()
print("async stall",[round(x,3) for x in stall],sorted(stall[1:])[2])
t=time.perf_counter()
dcp.save({k:v.detach() for k,v in sd.items()},storage_writer=W("/tmp/s"),no_dist=True)
print("sync save",round(time.perf_counter()-t,3))
class P(LP):
  def load_bytes(s,r,v):s.state_dict[r.dest_index.fqn]=torch.load(v,weights_only=True)
tg={k:torch.empty_like(v,device="cpu") for k,v in sd.items()}
dcp.load(tg,checkpoint_id="/tmp/a6",planner=P(flatten_state_dict=False),no_dist=True)
print("load equal",all(torch.equal(tg[k],v.cpu()) for k,v in sd.items()),torch.__version__)
