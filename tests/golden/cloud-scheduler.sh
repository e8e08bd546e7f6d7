#!/bin/sh
# idem schedule export --cloud-scheduler
# Build and push the image once (the Containerfile at the root of idem's repository):
#   gcloud artifacts repositories create idem --repository-format=docker --location=us-central1 --project=my-project
#   gcloud auth configure-docker us-central1-docker.pkg.dev
#   docker build -f Containerfile -t us-central1-docker.pkg.dev/my-project/idem/idem:latest . && docker push us-central1-docker.pkg.dev/my-project/idem/idem:latest
# The service account idem@my-project.iam.gserviceaccount.com needs:
#   roles/run.invoker on the project (Cloud Scheduler starts the Cloud Run jobs as it)
set -e

# The store's schema, brought up to date by this image before any job is deployed
gcloud run jobs deploy idem-migrate \
  --project=my-project \
  --region=us-central1 \
  --image=us-central1-docker.pkg.dev/my-project/idem/idem:latest \
  --service-account=idem@my-project.iam.gserviceaccount.com \
  --command=idem \
  --args=migrate \
  --set-env-vars='IDEM_STORE=postgres://idem@10.0.0.5/idem,IDEM_JOBS_DIR=/app/jobs,IDEM_LOG_FORMAT=json' \
  --task-timeout=1800s \
  --tasks=1 \
  --max-retries=3
gcloud run jobs execute idem-migrate \
  --project=my-project \
  --region=us-central1 \
  --wait

# daily_sales: "@daily" in UTC, date yesterday, lease 600s
gcloud run jobs deploy idem-daily-sales \
  --project=my-project \
  --region=us-central1 \
  --image=us-central1-docker.pkg.dev/my-project/idem/idem:latest \
  --service-account=idem@my-project.iam.gserviceaccount.com \
  --command=idem \
  --args='run,daily_sales,--date,yesterday,--trigger,scheduler' \
  --set-env-vars='IDEM_STORE=postgres://idem@10.0.0.5/idem,IDEM_JOBS_DIR=/app/jobs,IDEM_LOG_FORMAT=json' \
  --task-timeout=86400s \
  --tasks=1 \
  --max-retries=2
if gcloud scheduler jobs describe idem-daily-sales --project=my-project --location=us-central1 >/dev/null 2>&1; then verb=update; else verb=create; fi
gcloud scheduler jobs "$verb" http idem-daily-sales \
  --project=my-project \
  --location=us-central1 \
  --schedule='0 0 * * *' \
  --time-zone=UTC \
  --uri=https://us-central1-run.googleapis.com/apis/run.googleapis.com/v1/namespaces/my-project/jobs/idem-daily-sales:run \
  --http-method=POST \
  --oauth-service-account-email=idem@my-project.iam.gserviceaccount.com \
  --oauth-token-scope=https://www.googleapis.com/auth/cloud-platform \
  --attempt-deadline=150s \
  --max-retry-attempts=2 \
  --max-retry-duration=300s \
  --min-backoff=30s \
  --max-backoff=30s \
  --description='idem job daily_sales'

# hourly_events: "0 5 * * * MON-FRI" in Europe/Paris, date today, lease 7200s
gcloud run jobs deploy idem-hourly-events \
  --project=my-project \
  --region=us-central1 \
  --image=us-central1-docker.pkg.dev/my-project/idem/idem:latest \
  --service-account=idem@my-project.iam.gserviceaccount.com \
  --command=idem \
  --args='run,hourly_events,--date,today,--trigger,scheduler' \
  --set-env-vars='IDEM_STORE=postgres://idem@10.0.0.5/idem,IDEM_JOBS_DIR=/app/jobs,IDEM_LOG_FORMAT=json' \
  --task-timeout=86400s \
  --tasks=1 \
  --max-retries=2
if gcloud scheduler jobs describe idem-hourly-events --project=my-project --location=us-central1 >/dev/null 2>&1; then verb=update; else verb=create; fi
gcloud scheduler jobs "$verb" http idem-hourly-events \
  --project=my-project \
  --location=us-central1 \
  --schedule='5 * * * MON-FRI' \
  --time-zone=Europe/Paris \
  --uri=https://us-central1-run.googleapis.com/apis/run.googleapis.com/v1/namespaces/my-project/jobs/idem-hourly-events:run \
  --http-method=POST \
  --oauth-service-account-email=idem@my-project.iam.gserviceaccount.com \
  --oauth-token-scope=https://www.googleapis.com/auth/cloud-platform \
  --attempt-deadline=1800s \
  --max-retry-attempts=2 \
  --max-retry-duration=3600s \
  --min-backoff=30s \
  --max-backoff=30s \
  --description='idem job hourly_events'

# weekly_cleanup: "0 2 * * 0" in America/Los_Angeles, date yesterday, lease 3600s
gcloud run jobs deploy idem-weekly-cleanup \
  --project=my-project \
  --region=us-central1 \
  --image=us-central1-docker.pkg.dev/my-project/idem/idem:latest \
  --service-account=idem@my-project.iam.gserviceaccount.com \
  --command=idem \
  --args='run,weekly_cleanup,--date,yesterday,--trigger,scheduler' \
  --set-env-vars='IDEM_STORE=postgres://idem@10.0.0.5/idem,IDEM_JOBS_DIR=/app/jobs,IDEM_LOG_FORMAT=json' \
  --task-timeout=86400s \
  --tasks=1 \
  --max-retries=2
if gcloud scheduler jobs describe idem-weekly-cleanup --project=my-project --location=us-central1 >/dev/null 2>&1; then verb=update; else verb=create; fi
gcloud scheduler jobs "$verb" http idem-weekly-cleanup \
  --project=my-project \
  --location=us-central1 \
  --schedule='0 2 * * 0' \
  --time-zone=America/Los_Angeles \
  --uri=https://us-central1-run.googleapis.com/apis/run.googleapis.com/v1/namespaces/my-project/jobs/idem-weekly-cleanup:run \
  --http-method=POST \
  --oauth-service-account-email=idem@my-project.iam.gserviceaccount.com \
  --oauth-token-scope=https://www.googleapis.com/auth/cloud-platform \
  --attempt-deadline=900s \
  --max-retry-attempts=2 \
  --max-retry-duration=1800s \
  --min-backoff=30s \
  --max-backoff=30s \
  --description='idem job weekly_cleanup'
