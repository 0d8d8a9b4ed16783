from batchserve.cli.main import main

# The guard matters: engines that spawn processes (vLLM) re-import the main module in each.
if __name__ == "__main__":
    main()
