"""The process after init(): its stack, its state (engine, grids, plan), the fused all-reduce of
a step's gradients, the step's gradient clocks, and `world`. Imports engines, planning and below."""
