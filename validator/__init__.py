"""ghpsim's validator: runs simulator plans as real torch.distributed training (see README)."""
