"""Engine backends: other engines that run the target for a stage (vLLM), below the stages that use them."""
